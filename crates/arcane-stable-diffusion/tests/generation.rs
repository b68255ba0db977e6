//! stable-diffusion.cpp through this crate, against the provisioned library
//! (`ARCANE_SD_LIBRARY`), its header beside it (`../include/stable-diffusion.h`) and the
//! random-weight SDXS model (`ARCANE_SD_MODEL`): a missing part fails the test, naming
//! its variable. Pictures of random weights are noise: these tests check sizes,
//! formats, seeds, steps, cancellation and errors, not what is drawn.
#![allow(clippy::disallowed_methods)] // the layout test runs the C compiler

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use arcane_stable_diffusion::{Cancel, Event, Generation, ImageFormat, Library, Model};

fn provisioned(variable: &str) -> PathBuf {
    let path = std::env::var_os(variable)
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            panic!("{variable} is not set: run scripts/provision.sh and source its embedded.env")
        });
    assert!(
        path.exists(),
        "{variable}={} does not exist",
        path.display()
    );
    path
}

/// One model for every test of this binary (it takes 900 MB).
fn model() -> &'static Model {
    static MODEL: OnceLock<Model> = OnceLock::new();
    MODEL.get_or_init(|| {
        let library = Library::load(&provisioned("ARCANE_SD_LIBRARY")).unwrap();
        Model::load(library, &provisioned("ARCANE_SD_MODEL"), 2).unwrap()
    })
}

/// Held by each test that generates or runs a program, so that one test's look at
/// this process's children (`waitpid(-1)`) sees, and reaps, no other test's.
static GENERATING: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn generating() -> std::sync::MutexGuard<'static, ()> {
    GENERATING.lock().unwrap_or_else(|p| p.into_inner())
}

fn small(seed: u64, format: ImageFormat) -> Generation {
    Generation {
        prompt: "a lighthouse at dusk".into(),
        negative_prompt: String::new(),
        width: 64,
        height: 64,
        steps: 2,
        cfg_scale: 1.0,
        seed,
        count: 1,
        format,
        quality: 90,
    }
}

fn isolated(
    generation: &Generation,
    events: &mut Vec<Event>,
) -> Result<Vec<u8>, arcane_stable_diffusion::Error> {
    model().generate_isolated(generation, 0, &Cancel::new(), &mut |e| events.push(e))
}

#[test]
fn images_have_the_requested_size_and_format_and_the_seed_decides_the_bytes() {
    let _turn = generating();
    let mut events = Vec::new();
    let wide = Generation {
        width: 128,
        ..small(7, ImageFormat::Png)
    };
    let png = isolated(&wide, &mut events).unwrap();
    let decoded = image::load_from_memory_with_format(&png, image::ImageFormat::Png).unwrap();
    assert_eq!((decoded.width(), decoded.height()), (128, 64));
    assert_eq!(
        events,
        [
            Event::Step { step: 1, steps: 2 },
            Event::Step { step: 2, steps: 2 }
        ]
    );
    for (format, decoder) in [
        (ImageFormat::Jpeg, image::ImageFormat::Jpeg),
        (ImageFormat::Webp, image::ImageFormat::WebP),
    ] {
        let bytes = isolated(&small(7, format), &mut Vec::new()).unwrap();
        let decoded = image::load_from_memory_with_format(&bytes, decoder).unwrap();
        assert_eq!((decoded.width(), decoded.height()), (64, 64), "{format:?}");
    }
    let first = isolated(&small(11, ImageFormat::Png), &mut Vec::new()).unwrap();
    let again = isolated(&small(11, ImageFormat::Png), &mut Vec::new()).unwrap();
    let other = isolated(&small(12, ImageFormat::Png), &mut Vec::new()).unwrap();
    assert_eq!(first, again, "the same seed drew different bytes");
    assert_ne!(first, other, "two seeds drew the same image");
    // Image 1 of a request with seed 11 is the image of seed 12.
    let second = model()
        .generate_isolated(&small(11, ImageFormat::Png), 1, &Cancel::new(), &mut |_| {})
        .unwrap();
    assert_eq!(second, other);
    // The generator draws what this process draws.
    let here = model()
        .generate_here(&small(11, ImageFormat::Png), 0, &mut |_, _| {})
        .unwrap();
    let here = arcane_stable_diffusion::encode(&here, 64, 64, ImageFormat::Png, 90).unwrap();
    assert_eq!(here, first);
}

#[test]
fn a_cancelled_generation_stops_its_generator_and_the_next_one_runs() {
    let _turn = generating();
    let long = Generation {
        steps: 150,
        ..small(3, ImageFormat::Png)
    };
    let cancel = Cancel::new();
    let (tx, rx) = std::sync::mpsc::channel();
    let worker = {
        let (cancel, long) = (cancel.clone(), long.clone());
        std::thread::spawn(move || {
            model().generate_isolated(&long, 0, &cancel, &mut |event| {
                let _ = tx.send(event);
            })
        })
    };
    // Once it is computing, the client goes away.
    let first = rx.recv_timeout(Duration::from_secs(120)).unwrap();
    assert_eq!(
        first,
        Event::Step {
            step: 1,
            steps: 150
        }
    );
    cancel.cancel();
    let outcome = worker.join().unwrap();
    assert!(
        matches!(outcome, Err(arcane_stable_diffusion::Error::Cancelled)),
        "{outcome:?}"
    );
    let steps_seen = 1 + rx.try_iter().count();
    assert!(steps_seen < 150, "the generation ran to its end");
    // No child is left, not even a zombie.
    // SAFETY: waitpid with WNOHANG on any child only reports.
    let left = unsafe { libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) };
    assert_eq!(left, -1, "a child was left behind");
    // A cancelled token refuses a new generation at once; a fresh one generates, in a
    // fresh generator that keeps none of this process's descriptors (here, a pipe's
    // write end: the read end sees its end once this process closes its own).
    assert!(matches!(
        model().generate_isolated(&small(3, ImageFormat::Png), 0, &cancel, &mut |_| {}),
        Err(arcane_stable_diffusion::Error::Cancelled)
    ));
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into `fds`.
    assert_eq!(
        unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK) },
        0
    );
    isolated(&small(3, ImageFormat::Png), &mut Vec::new()).unwrap();
    // SAFETY: closing and reading descriptors this test owns.
    unsafe {
        libc::close(fds[1]);
        let mut byte = 0u8;
        let read = libc::read(fds[0], (&mut byte as *mut u8).cast(), 1);
        libc::close(fds[0]);
        assert_eq!(read, 0, "the generator kept a descriptor of its worker");
    }
    // The generator stays for the next image: one child runs, and it draws alike.
    // SAFETY: waitpid with WNOHANG on any child only reports.
    let running = unsafe { libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) };
    assert_eq!(running, 0, "no generator waits for the next image");
    let again = isolated(&small(3, ImageFormat::Png), &mut Vec::new()).unwrap();
    assert_eq!(
        again,
        isolated(&small(3, ImageFormat::Png), &mut Vec::new()).unwrap()
    );
}

#[test]
fn a_library_that_is_not_stable_diffusion_cpp_is_refused_by_name() {
    let libc = [
        "/lib/x86_64-linux-gnu/libc.so.6",
        "/lib/aarch64-linux-gnu/libc.so.6",
    ]
    .into_iter()
    .map(PathBuf::from)
    .find(|p| p.exists())
    .expect("no libc.so.6 to load");
    let error = Library::load(&libc).unwrap_err();
    assert!(
        error.to_string().contains("does not export `sd_version`"),
        "{error}"
    );
    let error = Library::load("/nonexistent/libstable-diffusion.so".as_ref()).unwrap_err();
    assert!(error.to_string().contains("/nonexistent"), "{error}");
    let version =
        arcane_stable_diffusion::library_version(&provisioned("ARCANE_SD_LIBRARY")).unwrap();
    assert!(!version.is_empty());
}

/// Every size and offset the declarations in `arcane_stable_diffusion::ffi` rely on, compared with
/// what a C compiler makes of the provisioned header.
#[test]
fn the_declarations_match_the_header() {
    use arcane_stable_diffusion::ffi::*;
    use std::mem::{offset_of, size_of};
    let _turn = generating();
    let library = provisioned("ARCANE_SD_LIBRARY");
    let include = library.parent().unwrap().parent().unwrap().join("include");
    assert!(
        include.join("stable-diffusion.h").exists(),
        "no header in {}",
        include.display()
    );
    macro_rules! fields {
        ($($t:ident { $($f:ident),* })*) => {{
            let mut c = String::from("#include <stdio.h>\n#include <stddef.h>\n#include \"stable-diffusion.h\"\nint main(void) {\n");
            let mut rust = Vec::new();
            $(
                c.push_str(&format!("printf(\"{0} %zu\\n\", sizeof({0}));\n", stringify!($t)));
                rust.push(format!("{} {}", stringify!($t), size_of::<$t>()));
                $(
                    c.push_str(&format!("printf(\"{0}.{1} %zu\\n\", offsetof({0}, {2}));\n", stringify!($t), stringify!($f), c_name(stringify!($f))));
                    rust.push(format!("{}.{} {}", stringify!($t), stringify!($f), offset_of!($t, $f)));
                )*
            )*
            c.push_str("return 0;\n}\n");
            (c, rust)
        }};
    }
    // Rust's snake case of the two fields C spells with capitals.
    fn c_name(field: &str) -> &str {
        match field {
            "fn_compute_blocks" => "Fn_compute_blocks",
            "bn_compute_blocks" => "Bn_compute_blocks",
            other => other,
        }
    }
    let (c, rust) = fields! {
        sd_ctx_params_t { model_path, taesd_path, control_net_path, embeddings, embedding_count, photo_maker_path, tensor_type_rules, vae_decode_only, free_params_immediately, n_threads, wtype, rng_type, sampler_rng_type, prediction, lora_apply_mode, offload_params_to_cpu, enable_mmap, diffusion_conv_direct, chroma_use_t5_mask, chroma_t5_mask_pad, qwen_image_zero_cond_t, max_vram }
        sd_image_t { width, height, channel, data }
        sd_slg_params_t { layers, layer_count, layer_start, scale }
        sd_guidance_params_t { txt_cfg, img_cfg, distilled_guidance, slg }
        sd_sample_params_t { guidance, scheduler, sample_method, sample_steps, eta, shifted_timestep, custom_sigmas, custom_sigmas_count, flow_shift }
        sd_pm_params_t { id_images, id_images_count, id_embed_path, style_strength }
        sd_tiling_params_t { enabled, tile_size_x, rel_size_y }
        sd_cache_params_t { mode, use_relative_threshold, reset_error_on_compute, fn_compute_blocks, bn_compute_blocks, scm_mask, scm_policy_dynamic, spectrum_w, spectrum_stop_percent }
        sd_hires_params_t { enabled, upscaler, model_path, scale, upscale_tile_size }
        sd_img_gen_params_t { loras, lora_count, prompt, negative_prompt, clip_skip, init_image, ref_images, ref_images_count, auto_resize_ref_image, increase_ref_index, mask_image, width, height, sample_params, strength, seed, batch_count, control_image, control_strength, pm_params, vae_tiling_params, cache, hires }
    };
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("probe.c"), c).unwrap();
    let compiled = std::process::Command::new("cc")
        .arg("-I")
        .arg(&include)
        .arg("-o")
        .arg(dir.path().join("probe"))
        .arg(dir.path().join("probe.c"))
        .output()
        .expect("cc (a C compiler) is needed to check the declarations");
    assert!(
        compiled.status.success(),
        "{}",
        String::from_utf8_lossy(&compiled.stderr)
    );
    let out = std::process::Command::new(dir.path().join("probe"))
        .output()
        .unwrap();
    let c: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    assert_eq!(rust, c);
}
