//! [`Runtime`]: ONNX Runtime's shared library, loaded once per process from an explicit
//! path (never from the environment or a search path).

use std::ffi::CStr;
use std::path::{Path, PathBuf};

use crate::Error;

/// The oldest ONNX Runtime this build works with (`1.<ort API version>`).
pub fn minimum_version() -> String {
    format!("1.{}", ort::MINOR_VERSION)
}

/// A loaded ONNX Runtime: its library, version, execution providers and environment.
pub struct Runtime {
    path: PathBuf,
    version: String,
    providers: Vec<String>,
    environment: ort::environment::Environment,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("providers", &self.providers)
            .finish()
    }
}

/// Reads the version an ONNX Runtime library reports (`OrtGetApiBase()->GetVersionString()`)
/// without initialising it, and checks it against [`minimum_version`].
///
/// Errors: `ARCANE_PREREQUISITE_MISSING` for a missing file, a library that does not
/// load or is not ONNX Runtime, or one older than the minimum; each names the path and
/// the minimum version.
pub fn library_version(path: &Path) -> Result<String, Error> {
    let minimum = minimum_version();
    let missing = |reason: String| Error::LibraryMissing {
        path: path.to_path_buf(),
        reason,
        minimum: minimum.clone(),
    };
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_file() => {}
        Ok(_) => return Err(missing("it is not a regular file".into())),
        Err(e) => return Err(missing(e.to_string())),
    }
    let invalid = |reason: String| Error::LibraryInvalid {
        path: path.to_path_buf(),
        reason,
        minimum: minimum.clone(),
    };
    // SAFETY: loading a library runs its initialisers; the path is the one the user
    // registered as ONNX Runtime, which is what this process is about to use anyway.
    let library = unsafe { libloading::Library::new(path) }.map_err(|e| invalid(e.to_string()))?;
    type GetApiBase = unsafe extern "C" fn() -> *const ort::sys::OrtApiBase;
    // SAFETY: `OrtGetApiBase` has this signature in every ONNX Runtime release.
    let get_base = unsafe { library.get::<GetApiBase>(b"OrtGetApiBase") }
        .map_err(|_| invalid("it does not export `OrtGetApiBase`".into()))?;
    // SAFETY: the function takes no arguments and returns a static table or null.
    let base = unsafe { get_base() };
    if base.is_null() {
        return Err(invalid("`OrtGetApiBase` returned nothing".into()));
    }
    // SAFETY: `base` is non-null and points at the library's static `OrtApiBase`, whose
    // `GetVersionString` returns a static NUL-terminated string.
    let version = unsafe { CStr::from_ptr(((*base).GetVersionString)()) }
        .to_str()
        .map_err(|_| invalid("its version string is not UTF-8".into()))?
        .to_string();
    let minor = version
        .split('.')
        .nth(1)
        .and_then(|m| m.parse::<u32>().ok())
        .ok_or_else(|| invalid(format!("its version `{version}` is malformed")))?;
    if !version.starts_with("1.") || minor < ort::MINOR_VERSION {
        return Err(Error::LibraryTooOld {
            path: path.to_path_buf(),
            found: version,
            minimum,
        });
    }
    Ok(version)
}

impl Runtime {
    /// Loads ONNX Runtime from `path` into this process (once: a process holds one
    /// runtime) after [`library_version`]'s checks, and lists its execution providers.
    pub fn load(path: &Path) -> Result<Runtime, Error> {
        let version = library_version(path)?;
        let builder = ort::init_from(path).map_err(|e| Error::LibraryInvalid {
            path: path.to_path_buf(),
            reason: e.to_string(),
            minimum: minimum_version(),
        })?;
        let environment = builder
            .with_name("arcane")
            .with_telemetry(false)
            .build()
            .map_err(|e| Error::runtime("creating the ONNX Runtime environment", e))?;
        let providers = available_providers()?;
        Ok(Runtime {
            path: path.to_path_buf(),
            version,
            providers,
            environment,
        })
    }

    /// The library's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The version the library reports (`1.31.1`).
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The execution providers the library was built with (`CPUExecutionProvider`, …).
    pub fn providers(&self) -> &[String] {
        &self.providers
    }

    /// Whether the library has `provider`.
    pub fn has_provider(&self, provider: &str) -> bool {
        self.providers.iter().any(|p| p == provider)
    }

    pub(crate) fn environment(&self) -> &ort::environment::Environment {
        &self.environment
    }
}

fn available_providers() -> Result<Vec<String>, Error> {
    let api = ort::api();
    let mut list: *mut *mut std::ffi::c_char = std::ptr::null_mut();
    let mut count: std::ffi::c_int = 0;
    // SAFETY: the out-pointers are valid; ONNX Runtime fills them or returns a status.
    let status = unsafe { (api.GetAvailableProviders)(&mut list, &mut count) };
    if !status.0.is_null() {
        // SAFETY: a non-null status is owned by us and released here.
        unsafe { (api.ReleaseStatus)(status.0) };
        return Err(Error::runtime(
            "listing execution providers",
            "GetAvailableProviders failed",
        ));
    }
    let mut providers = Vec::new();
    for i in 0..usize::try_from(count).unwrap_or(0) {
        // SAFETY: `list` holds `count` NUL-terminated strings.
        let name = unsafe { CStr::from_ptr(*list.add(i)) };
        providers.push(name.to_string_lossy().into_owned());
    }
    // SAFETY: releases exactly what GetAvailableProviders allocated.
    let _ = unsafe { (api.ReleaseAvailableProviders)(list, count) };
    Ok(providers)
}
