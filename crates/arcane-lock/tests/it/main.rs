//! Integration tests of `arcane-lock`: one module per area.

mod support;

mod basics;
mod nested;
mod paths;
mod processes;
mod stale;
mod wait;
