//! [`Library`]: stable-diffusion.cpp's shared library, loaded from an explicit path
//! (never a search path), and [`Model`]: one diffusion model loaded by it.

use std::ffi::{c_char, c_float, c_int, c_void, CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::ffi::{self, Api};
use crate::{Error, Generation};

/// A loaded stable-diffusion.cpp library.
pub struct Library {
    path: PathBuf,
    version: String,
    api: Api,
    // Kept loaded for as long as `api`'s pointers are used.
    _library: libloading::Library,
}

impl std::fmt::Debug for Library {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Library")
            .field("path", &self.path)
            .field("version", &self.version)
            .finish()
    }
}

impl Library {
    /// Loads the library at `path` (a regular file) and resolves every function Arcane
    /// calls; `Error::Library` names the path and what is missing.
    pub fn load(path: &Path) -> Result<Library, Error> {
        let refuse = |reason: String| Error::Library {
            path: path.to_path_buf(),
            reason,
        };
        match std::fs::metadata(path) {
            Ok(meta) if meta.is_file() => {}
            Ok(_) => return Err(refuse("it is not a regular file".into())),
            Err(e) => return Err(refuse(e.to_string())),
        }
        // SAFETY: loading a library runs its initialisers; the path is the one the user
        // registered as stable-diffusion.cpp, which this process is about to use anyway.
        let library =
            unsafe { libloading::Library::new(path) }.map_err(|e| refuse(e.to_string()))?;
        // SAFETY: the symbols are looked up by the names stable-diffusion.cpp's header
        // gives them, with its signatures.
        let api = unsafe { Api::resolve(&library) }
            .map_err(|name| refuse(format!("it does not export `{name}`")))?;
        // SAFETY: both return static NUL-terminated strings (or null).
        let (version, commit) = unsafe { (text((api.sd_version)()), text((api.sd_commit)())) };
        // Quiet until a model is loaded: sd.cpp prints progress bars on stdout otherwise.
        // SAFETY: the callbacks are `extern "C"` functions with the header's signatures.
        unsafe {
            (api.sd_set_log_callback)(Some(log_line), std::ptr::null_mut());
            (api.sd_set_progress_callback)(Some(no_progress), std::ptr::null_mut());
        }
        // A build from a source distribution knows no commit.
        let version = match commit.as_str() {
            "" | "unknown" => version,
            _ => format!("{version} ({commit})"),
        };
        Ok(Library {
            path: path.to_path_buf(),
            version,
            api,
            _library: library,
        })
    }

    /// The library's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What the library says of itself: `<version> (<commit>)`, or its version alone
    /// when it knows no commit.
    pub fn version(&self) -> &str {
        &self.version
    }

    pub(crate) fn api(&self) -> &Api {
        &self.api
    }
}

/// The version the library at `path` reports, after loading it as [`Library::load`]
/// does: what `arcane runtime add stable-diffusion.cpp --library PATH` records.
pub fn library_version(path: &Path) -> Result<String, Error> {
    Library::load(path).map(|library| library.version)
}

/// A diffusion model loaded by stable-diffusion.cpp, ready to generate.
pub struct Model {
    library: Library,
    path: PathBuf,
    ctx: *mut ffi::sd_ctx_t,
    // One generation at a time (the progress callback is the library's global), and
    // the process that draws for `generate_isolated` while it lives.
    turn: Mutex<Option<crate::child::Generator>>,
}

// SAFETY: the context is only used under `turn` (or in a child process holding its own
// copy), and freed once, on drop.
unsafe impl Send for Model {}
// SAFETY: as above; `&Model` gives no unsynchronised access to the context.
unsafe impl Sync for Model {}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model").field("path", &self.path).finish()
    }
}

impl Model {
    /// Loads the model file at `path` with `threads` compute threads.
    pub fn load(library: Library, path: &Path, threads: usize) -> Result<Model, Error> {
        let invalid = |hint: &str| Error::ModelInvalid {
            path: path.to_path_buf(),
            hint: hint.to_string(),
        };
        let c_path = CString::new(path.as_os_str().as_bytes())
            .map_err(|_| invalid(": its path contains a NUL byte"))?;
        let api = *library.api();
        // SAFETY: zeroed plain data (pointers null, numbers 0) is a valid value of the
        // struct, which `sd_ctx_params_init` then fills with the library's defaults.
        let mut params: ffi::sd_ctx_params_t = unsafe { std::mem::zeroed() };
        // SAFETY: `params` is a valid, writable `sd_ctx_params_t`.
        unsafe { (api.sd_ctx_params_init)(&mut params) };
        params.model_path = c_path.as_ptr();
        params.vae_decode_only = true;
        params.free_params_immediately = false;
        params.n_threads = c_int::try_from(threads.max(1)).unwrap_or(1);
        params.wtype = ffi::SD_TYPE_COUNT;
        // SAFETY: `params` is initialised and its strings outlive the call.
        let ctx = unsafe { (api.new_sd_ctx)(&params) };
        if ctx.is_null() {
            return Err(invalid(" (its log above says why)"));
        }
        let model = Model {
            library,
            path: path.to_path_buf(),
            ctx,
            turn: Mutex::new(None),
        };
        // SAFETY: `ctx` is the live context just created.
        if !unsafe { (api.sd_ctx_supports_image_generation)(ctx) } {
            return Err(invalid(": it is a video model, not an image model"));
        }
        Ok(model)
    }

    /// The model file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The library that loaded it.
    pub fn library(&self) -> &Library {
        &self.library
    }

    /// Generates image `index` of `generation` (seed `seed + index`) in this process,
    /// calling `on_step(step, steps)` after each sampling step: 8-bit RGB pixels.
    pub fn generate_here(
        &self,
        generation: &Generation,
        index: u32,
        on_step: &mut dyn FnMut(u32, u32),
    ) -> Result<Vec<u8>, Error> {
        let _turn = self.turn();
        self.generate_unlocked(generation, index, on_step)
    }

    /// Holds the model's one turn: one generation at a time, in this process or in the
    /// generator process (forked while the turn is held, so its copy of the lock stays
    /// held: it generates with [`Model::generate_unlocked`]).
    pub(crate) fn turn(&self) -> std::sync::MutexGuard<'_, Option<crate::child::Generator>> {
        self.turn
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// [`Model::generate_here`] for a caller that holds the turn.
    pub(crate) fn generate_unlocked(
        &self,
        generation: &Generation,
        index: u32,
        on_step: &mut dyn FnMut(u32, u32),
    ) -> Result<Vec<u8>, Error> {
        let prompt = c_text("prompt", &generation.prompt)?;
        let negative = c_text("negative_prompt", &generation.negative_prompt)?;
        let api = *self.library.api();
        // SAFETY: zeroed plain data is a valid value, then filled by the library.
        let mut params: ffi::sd_img_gen_params_t = unsafe { std::mem::zeroed() };
        // SAFETY: `params` is a valid, writable `sd_img_gen_params_t`.
        unsafe { (api.sd_img_gen_params_init)(&mut params) };
        params.prompt = prompt.as_ptr();
        params.negative_prompt = negative.as_ptr();
        params.width = c_int::try_from(generation.width).unwrap_or(c_int::MAX);
        params.height = c_int::try_from(generation.height).unwrap_or(c_int::MAX);
        params.seed =
            i64::try_from(generation.seed.saturating_add(index.into())).unwrap_or(i64::MAX);
        params.batch_count = 1;
        params.sample_params.sample_steps = c_int::try_from(generation.steps).unwrap_or(1);
        params.sample_params.guidance.txt_cfg = generation.cfg_scale;
        let mut on_step: &mut dyn FnMut(u32, u32) = on_step;
        let data = (&mut on_step as *mut &mut dyn FnMut(u32, u32)).cast::<c_void>();
        // SAFETY: the callback reads `data` as the `&mut dyn FnMut` it is, only during
        // `generate_image` (it is unset again before `on_step` goes out of scope); the
        // context is live and the strings outlive the call.
        let images = unsafe {
            (api.sd_set_progress_callback)(Some(step_to_closure), data);
            let images = (api.generate_image)(self.ctx, &params);
            (api.sd_set_progress_callback)(Some(no_progress), std::ptr::null_mut());
            images
        };
        if images.is_null() {
            return Err(Error::Failed {
                reason: "stable-diffusion.cpp gave no image (its log says why)".into(),
            });
        }
        // SAFETY: `generate_image` returns `batch_count` (1) malloc'd images whose data
        // are `width × height × channel` malloc'd bytes, both ours to free.
        unsafe {
            let image = *images;
            let pixels = rgb(&image, generation.width, generation.height);
            libc::free(image.data.cast());
            libc::free(images.cast());
            pixels
        }
    }
}

impl Drop for Model {
    fn drop(&mut self) {
        if let Some(generator) = self.turn().take() {
            generator.stop();
        }
        // SAFETY: `ctx` is live and freed only here.
        unsafe { (self.library.api().free_sd_ctx)(self.ctx) };
    }
}

/// The RGB bytes of `image`, which must be `width × height`.
///
/// # Safety
/// `image.data` must point at `width × height × channel` readable bytes, or be null.
unsafe fn rgb(image: &ffi::sd_image_t, width: u32, height: u32) -> Result<Vec<u8>, Error> {
    if image.data.is_null()
        || image.width != width
        || image.height != height
        || !(3..=4).contains(&image.channel)
    {
        return Err(Error::Failed {
            reason: format!(
                "stable-diffusion.cpp gave a {}x{} image of {} channels for {width}x{height}",
                image.width, image.height, image.channel
            ),
        });
    }
    let channels = image.channel as usize;
    let pixels = width as usize * height as usize;
    // SAFETY: the caller vouches for the length.
    let data = unsafe { std::slice::from_raw_parts(image.data, pixels * channels) };
    Ok(data
        .chunks_exact(channels)
        .flat_map(|px| [px[0], px[1], px[2]])
        .collect())
}

fn c_text(field: &'static str, text: &str) -> Result<CString, Error> {
    CString::new(text).map_err(|_| {
        Error::bad(
            field,
            format!("`{field}` contains a NUL character"),
            serde_json::json!({}),
        )
    })
}

/// A static C string as text (empty for null).
///
/// # Safety
/// `text` must be null or a NUL-terminated string that lives for the call.
unsafe fn text(text: *const c_char) -> String {
    if text.is_null() {
        return String::new();
    }
    // SAFETY: as the caller vouches.
    unsafe { CStr::from_ptr(text) }
        .to_string_lossy()
        .into_owned()
}

/// The library's log lines (info and above) go to standard error as they are, with
/// write(2): no lock is taken, so this is safe in a forked child too.
unsafe extern "C" fn log_line(level: c_int, text: *const c_char, _data: *mut c_void) {
    if level < 1 || text.is_null() {
        return;
    }
    // SAFETY: the library passes a NUL-terminated line.
    let bytes = unsafe { CStr::from_ptr(text) }.to_bytes();
    crate::child::write_all(2, bytes);
}

unsafe extern "C" fn no_progress(_step: c_int, _steps: c_int, _time: c_float, _data: *mut c_void) {}

unsafe extern "C" fn step_to_closure(step: c_int, steps: c_int, _time: c_float, data: *mut c_void) {
    if data.is_null() || step <= 0 {
        return;
    }
    // SAFETY: `generate_here` passes a `&mut &mut dyn FnMut(u32, u32)` that outlives
    // the generation.
    let on_step = unsafe { &mut *data.cast::<&mut dyn FnMut(u32, u32)>() };
    on_step(step.unsigned_abs(), steps.unsigned_abs());
}
