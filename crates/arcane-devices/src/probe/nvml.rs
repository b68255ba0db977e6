//! NVIDIA GPUs through NVML, loaded at run time (no build-time CUDA dependency).
//!
//! `nvml-wrapper` `dlopen`s `libnvidia-ml.so.1` when [`list`] runs. Every failure is
//! a value: no library or no driver is [`NvmlListing::Unavailable`], a failed device
//! count is [`NvmlListing::Failed`], and a GPU that cannot be read is listed in
//! `unreadable`. The calls run under `catch_unwind` so that even a panic in the
//! wrapper becomes a `Failed` listing rather than a crash.

use std::panic::{catch_unwind, AssertUnwindSafe};

use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;

use super::NvmlLibrary;

/// One GPU as NVML reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct NvidiaGpu {
    /// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
    pub uuid: String,
    /// The product name.
    pub name: String,
    /// The PCI address, `dddd:bb:dd.f`.
    pub pci: Option<String>,
    /// Total framebuffer memory, MiB.
    pub memory_mib: Option<u64>,
    /// The driver version.
    pub driver_version: Option<String>,
    /// MIG mode is enabled.
    pub mig_enabled: bool,
}

impl NvidiaGpu {
    /// A GPU with `uuid` and `name`; other fields unknown.
    pub fn new(uuid: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            uuid: uuid.into(),
            name: name.into(),
            pci: None,
            memory_mib: None,
            driver_version: None,
            mig_enabled: false,
        }
    }

    /// The same GPU with MIG mode enabled.
    pub fn with_mig(mut self) -> Self {
        self.mig_enabled = true;
        self
    }

    /// The same GPU at PCI address `pci`.
    pub fn at_pci(mut self, pci: impl Into<String>) -> Self {
        self.pci = Some(pci.into());
        self
    }
}

/// What NVML answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NvmlListing {
    /// NVML listed its GPUs; `unreadable` says, one sentence each, which could not be read.
    Listed {
        /// The GPUs read.
        gpus: Vec<NvidiaGpu>,
        /// One sentence per GPU that could not be read.
        unreadable: Vec<String>,
    },
    /// NVML could not be loaded or initialized.
    Unavailable {
        /// Why.
        message: String,
    },
    /// NVML was loaded but could not list devices.
    Failed {
        /// Why.
        message: String,
    },
}

/// The message of an NVML error with its causes.
fn describe(error: &NvmlError) -> String {
    let mut text = error.to_string();
    let mut source: Option<&dyn std::error::Error> = std::error::Error::source(error);
    while let Some(cause) = source {
        let line = cause.to_string();
        if !text.contains(&line) {
            text.push_str(": ");
            text.push_str(&line);
        }
        source = cause.source();
    }
    text
}

/// Loads and initializes NVML.
pub(crate) fn init(library: &NvmlLibrary) -> Result<Nvml, String> {
    let result = catch_unwind(AssertUnwindSafe(|| match library {
        NvmlLibrary::System => Nvml::init(),
        NvmlLibrary::Path(path) => Nvml::builder().lib_path(path.as_os_str()).init(),
        NvmlLibrary::Disabled => Err(NvmlError::Unknown),
    }));
    match (library, result) {
        (NvmlLibrary::Disabled, _) => Err("NVML is disabled for this probe".to_string()),
        (_, Ok(Ok(nvml))) => Ok(nvml),
        (NvmlLibrary::System, Ok(Err(error))) => Err(format!(
            "NVML (`libnvidia-ml.so.1`, installed with the NVIDIA driver) could not be loaded or initialized: {}",
            describe(&error)
        )),
        (NvmlLibrary::Path(path), Ok(Err(error))) => Err(format!(
            "NVML `{}` could not be loaded or initialized: {}",
            path.display(),
            describe(&error)
        )),
        (_, Err(_)) => Err("NVML initialization panicked".to_string()),
    }
}

/// Normalizes NVML's bus id (`00000000:01:00.0`) to sysfs's form (`0000:01:00.0`).
pub(crate) fn normalize_bus_id(bus_id: &str) -> Option<String> {
    let (domain, rest) = bus_id.trim().split_once(':')?;
    let (bus, slot) = rest.split_once(':')?;
    let (device, function) = slot.split_once('.')?;
    let domain = u32::from_str_radix(domain, 16).ok()?;
    let bus = u8::from_str_radix(bus, 16).ok()?;
    let device = u8::from_str_radix(device, 16).ok()?;
    let function = u8::from_str_radix(function, 16).ok()?;
    Some(if domain <= 0xffff {
        format!("{domain:04x}:{bus:02x}:{device:02x}.{function:x}")
    } else {
        format!("{domain:08x}:{bus:02x}:{device:02x}.{function:x}")
    })
}

/// Lists the GPUs NVML sees.
pub fn list(library: &NvmlLibrary) -> NvmlListing {
    let nvml = match init(library) {
        Ok(nvml) => nvml,
        Err(message) => return NvmlListing::Unavailable { message },
    };
    match catch_unwind(AssertUnwindSafe(|| list_with(&nvml))) {
        Ok(listing) => listing,
        Err(_) => NvmlListing::Failed {
            message: "reading GPUs through NVML panicked".to_string(),
        },
    }
}

fn list_with(nvml: &Nvml) -> NvmlListing {
    let driver_version = nvml.sys_driver_version().ok();
    let count = match nvml.device_count() {
        Ok(count) => count,
        Err(error) => {
            return NvmlListing::Failed {
                message: format!("NVML could not count GPUs: {}", describe(&error)),
            }
        }
    };
    let mut gpus = Vec::new();
    let mut unreadable = Vec::new();
    for index in 0..count {
        let device = match nvml.device_by_index(index) {
            Ok(device) => device,
            Err(error) => {
                unreadable.push(format!(
                    "NVML could not open GPU {index}: {}",
                    describe(&error)
                ));
                continue;
            }
        };
        let uuid = match device.uuid() {
            Ok(uuid) if crate::resolve::is_gpu_uuid(&uuid) => uuid,
            Ok(uuid) => {
                unreadable.push(format!(
                    "NVML reported `{uuid}` as GPU {index}'s UUID, which is not a full GPU UUID"
                ));
                continue;
            }
            Err(error) => {
                unreadable.push(format!(
                    "NVML could not read GPU {index}'s UUID: {}",
                    describe(&error)
                ));
                continue;
            }
        };
        let pci = device
            .pci_info()
            .ok()
            .and_then(|info| normalize_bus_id(&info.bus_id));
        gpus.push(NvidiaGpu {
            name: device
                .name()
                .unwrap_or_else(|_| format!("NVIDIA GPU {index}")),
            memory_mib: device.memory_info().ok().map(|m| m.total / (1024 * 1024)),
            driver_version: driver_version.clone(),
            // NVML_DEVICE_MIG_ENABLE is 1; GPUs without MIG support answer NotSupported.
            mig_enabled: device.mig_mode().is_ok_and(|mode| mode.current == 1),
            pci,
            uuid,
        });
    }
    NvmlListing::Listed { gpus, unreadable }
}

/// For each GPU, its UUID and the pids of the processes NVML lists on it (compute and
/// graphics contexts).
pub(crate) fn processes(library: &NvmlLibrary) -> Result<Vec<(String, Vec<u32>)>, String> {
    let nvml = init(library)?;
    let run = || -> Result<Vec<(String, Vec<u32>)>, String> {
        let count = nvml
            .device_count()
            .map_err(|error| format!("NVML could not count GPUs: {}", describe(&error)))?;
        let mut out = Vec::new();
        for index in 0..count {
            let device = nvml.device_by_index(index).map_err(|error| {
                format!("NVML could not open GPU {index}: {}", describe(&error))
            })?;
            let uuid = device.uuid().map_err(|error| {
                format!(
                    "NVML could not read GPU {index}'s UUID: {}",
                    describe(&error)
                )
            })?;
            let compute = device.running_compute_processes().map_err(|error| {
                format!(
                    "NVML could not list the processes on `{uuid}`: {}",
                    describe(&error)
                )
            })?;
            // Graphics contexts are listed too where the driver supports it; a CUDA
            // engine always has a compute context, so a failure here is not fatal.
            let graphics = device.running_graphics_processes().unwrap_or_default();
            let mut pids: Vec<u32> = compute
                .iter()
                .chain(graphics.iter())
                .map(|process| process.pid)
                .collect();
            pids.sort_unstable();
            pids.dedup();
            out.push((uuid, pids));
        }
        Ok(out)
    };
    catch_unwind(AssertUnwindSafe(run))
        .unwrap_or_else(|_| Err("reading GPU processes through NVML panicked".to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_ids_are_normalized_to_the_sysfs_form() {
        assert_eq!(
            normalize_bus_id("00000000:01:00.0").as_deref(),
            Some("0000:01:00.0")
        );
        assert_eq!(
            normalize_bus_id("00000000:C1:00.1").as_deref(),
            Some("0000:c1:00.1")
        );
        assert_eq!(normalize_bus_id("garbage"), None);
    }

    #[test]
    fn a_missing_library_is_unavailable_not_a_crash() {
        let listing = list(&NvmlLibrary::Path("/nonexistent/libnvidia-ml.so.1".into()));
        match listing {
            NvmlListing::Unavailable { message } => {
                assert!(
                    message.contains("/nonexistent/libnvidia-ml.so.1"),
                    "{message}"
                )
            }
            other => panic!("expected Unavailable, got {other:?}"),
        }
    }
}
