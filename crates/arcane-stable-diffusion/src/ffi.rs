//! stable-diffusion.cpp's C API (`include/stable-diffusion.h` of the version vendored in
//! `stable-diffusion-cpp-python` 0.4.7), declared by hand: only the structures Arcane
//! passes, field for field, and the functions it calls, looked up by name in the
//! library the user registered. A test compiles a C program against the provisioned
//! header and compares every size and offset used here.

#![allow(non_camel_case_types, missing_docs)]

use std::ffi::{c_char, c_float, c_int, c_void};

/// `enum sd_type_t`'s `SD_TYPE_COUNT`: "the type the file has".
pub const SD_TYPE_COUNT: c_int = 41;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct sd_embedding_t {
    pub name: *const c_char,
    pub path: *const c_char,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct sd_ctx_params_t {
    pub model_path: *const c_char,
    pub clip_l_path: *const c_char,
    pub clip_g_path: *const c_char,
    pub clip_vision_path: *const c_char,
    pub t5xxl_path: *const c_char,
    pub llm_path: *const c_char,
    pub llm_vision_path: *const c_char,
    pub diffusion_model_path: *const c_char,
    pub high_noise_diffusion_model_path: *const c_char,
    pub vae_path: *const c_char,
    pub taesd_path: *const c_char,
    pub control_net_path: *const c_char,
    pub embeddings: *const sd_embedding_t,
    pub embedding_count: u32,
    pub photo_maker_path: *const c_char,
    pub tensor_type_rules: *const c_char,
    pub vae_decode_only: bool,
    pub free_params_immediately: bool,
    pub n_threads: c_int,
    pub wtype: c_int,
    pub rng_type: c_int,
    pub sampler_rng_type: c_int,
    pub prediction: c_int,
    pub lora_apply_mode: c_int,
    pub offload_params_to_cpu: bool,
    pub enable_mmap: bool,
    pub keep_clip_on_cpu: bool,
    pub keep_control_net_on_cpu: bool,
    pub keep_vae_on_cpu: bool,
    pub flash_attn: bool,
    pub diffusion_flash_attn: bool,
    pub tae_preview_only: bool,
    pub diffusion_conv_direct: bool,
    pub vae_conv_direct: bool,
    pub circular_x: bool,
    pub circular_y: bool,
    pub force_sdxl_vae_conv_scale: bool,
    pub chroma_use_dit_mask: bool,
    pub chroma_use_t5_mask: bool,
    pub chroma_t5_mask_pad: c_int,
    pub qwen_image_zero_cond_t: bool,
    pub max_vram: c_float,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct sd_image_t {
    pub width: u32,
    pub height: u32,
    pub channel: u32,
    pub data: *mut u8,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct sd_slg_params_t {
    pub layers: *mut c_int,
    pub layer_count: usize,
    pub layer_start: c_float,
    pub layer_end: c_float,
    pub scale: c_float,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct sd_guidance_params_t {
    pub txt_cfg: c_float,
    pub img_cfg: c_float,
    pub distilled_guidance: c_float,
    pub slg: sd_slg_params_t,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct sd_sample_params_t {
    pub guidance: sd_guidance_params_t,
    pub scheduler: c_int,
    pub sample_method: c_int,
    pub sample_steps: c_int,
    pub eta: c_float,
    pub shifted_timestep: c_int,
    pub custom_sigmas: *mut c_float,
    pub custom_sigmas_count: c_int,
    pub flow_shift: c_float,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct sd_pm_params_t {
    pub id_images: *mut sd_image_t,
    pub id_images_count: c_int,
    pub id_embed_path: *const c_char,
    pub style_strength: c_float,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct sd_tiling_params_t {
    pub enabled: bool,
    pub tile_size_x: c_int,
    pub tile_size_y: c_int,
    pub target_overlap: c_float,
    pub rel_size_x: c_float,
    pub rel_size_y: c_float,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct sd_cache_params_t {
    pub mode: c_int,
    pub reuse_threshold: c_float,
    pub start_percent: c_float,
    pub end_percent: c_float,
    pub error_decay_rate: c_float,
    pub use_relative_threshold: bool,
    pub reset_error_on_compute: bool,
    pub fn_compute_blocks: c_int,
    pub bn_compute_blocks: c_int,
    pub residual_diff_threshold: c_float,
    pub max_warmup_steps: c_int,
    pub max_cached_steps: c_int,
    pub max_continuous_cached_steps: c_int,
    pub taylorseer_n_derivatives: c_int,
    pub taylorseer_skip_interval: c_int,
    pub scm_mask: *const c_char,
    pub scm_policy_dynamic: bool,
    pub spectrum_w: c_float,
    pub spectrum_m: c_int,
    pub spectrum_lam: c_float,
    pub spectrum_window_size: c_int,
    pub spectrum_flex_window: c_float,
    pub spectrum_warmup_steps: c_int,
    pub spectrum_stop_percent: c_float,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct sd_hires_params_t {
    pub enabled: bool,
    pub upscaler: c_int,
    pub model_path: *const c_char,
    pub scale: c_float,
    pub target_width: c_int,
    pub target_height: c_int,
    pub steps: c_int,
    pub denoising_strength: c_float,
    pub upscale_tile_size: c_int,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct sd_img_gen_params_t {
    pub loras: *const c_void,
    pub lora_count: u32,
    pub prompt: *const c_char,
    pub negative_prompt: *const c_char,
    pub clip_skip: c_int,
    pub init_image: sd_image_t,
    pub ref_images: *mut sd_image_t,
    pub ref_images_count: c_int,
    pub auto_resize_ref_image: bool,
    pub increase_ref_index: bool,
    pub mask_image: sd_image_t,
    pub width: c_int,
    pub height: c_int,
    pub sample_params: sd_sample_params_t,
    pub strength: c_float,
    pub seed: i64,
    pub batch_count: c_int,
    pub control_image: sd_image_t,
    pub control_strength: c_float,
    pub pm_params: sd_pm_params_t,
    pub vae_tiling_params: sd_tiling_params_t,
    pub cache: sd_cache_params_t,
    pub hires: sd_hires_params_t,
}

/// `struct sd_ctx_t`, opaque.
#[repr(C)]
pub struct sd_ctx_t {
    _private: [u8; 0],
}

pub type sd_log_cb_t =
    Option<unsafe extern "C" fn(level: c_int, text: *const c_char, data: *mut c_void)>;
pub type sd_progress_cb_t =
    Option<unsafe extern "C" fn(step: c_int, steps: c_int, time: c_float, data: *mut c_void)>;

/// The functions Arcane calls, resolved once from the library.
#[derive(Debug, Clone, Copy)]
pub struct Api {
    pub sd_version: unsafe extern "C" fn() -> *const c_char,
    pub sd_commit: unsafe extern "C" fn() -> *const c_char,
    pub sd_set_log_callback: unsafe extern "C" fn(sd_log_cb_t, *mut c_void),
    pub sd_set_progress_callback: unsafe extern "C" fn(sd_progress_cb_t, *mut c_void),
    pub sd_ctx_params_init: unsafe extern "C" fn(*mut sd_ctx_params_t),
    pub new_sd_ctx: unsafe extern "C" fn(*const sd_ctx_params_t) -> *mut sd_ctx_t,
    pub free_sd_ctx: unsafe extern "C" fn(*mut sd_ctx_t),
    pub sd_ctx_supports_image_generation: unsafe extern "C" fn(*const sd_ctx_t) -> bool,
    pub sd_img_gen_params_init: unsafe extern "C" fn(*mut sd_img_gen_params_t),
    pub generate_image:
        unsafe extern "C" fn(*mut sd_ctx_t, *const sd_img_gen_params_t) -> *mut sd_image_t,
}

impl Api {
    /// Resolves every function from `library`; the name of the first missing one is
    /// the error.
    ///
    /// # Safety
    /// `library` must be stable-diffusion.cpp's library of the version these
    /// declarations describe: the signatures are taken on trust.
    pub unsafe fn resolve(library: &libloading::Library) -> Result<Api, &'static str> {
        macro_rules! get {
            ($name:ident) => {
                // SAFETY: the caller vouches for the library; the symbol's type is
                // the one its header declares.
                *unsafe { library.get(concat!(stringify!($name), "\0").as_bytes()) }
                    .map_err(|_| stringify!($name))?
            };
        }
        Ok(Api {
            sd_version: get!(sd_version),
            sd_commit: get!(sd_commit),
            sd_set_log_callback: get!(sd_set_log_callback),
            sd_set_progress_callback: get!(sd_set_progress_callback),
            sd_ctx_params_init: get!(sd_ctx_params_init),
            new_sd_ctx: get!(new_sd_ctx),
            free_sd_ctx: get!(free_sd_ctx),
            sd_ctx_supports_image_generation: get!(sd_ctx_supports_image_generation),
            sd_img_gen_params_init: get!(sd_img_gen_params_init),
            generate_image: get!(generate_image),
        })
    }
}
