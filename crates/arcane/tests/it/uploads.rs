//! Issue 28: hostile uploads and requests to the speech workers (whisper.cpp, Piper)
//! are refused with a clear 400 or served within a memory bound, measured on the
//! worker's peak RSS.
