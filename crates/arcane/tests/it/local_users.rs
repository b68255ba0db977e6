//! Issue 28: what another local user can write or reach does not become Arcane's: web
//! directories, `command` engines' ports, engine libraries, a reload storm, a host
//! that stops answering.
