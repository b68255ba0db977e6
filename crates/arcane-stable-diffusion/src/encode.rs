//! Encoding a generated picture (8-bit RGB) as PNG, JPEG or WebP (lossless), the
//! formats OpenAI's `output_format` names.

use std::io::Cursor;

use image::codecs::jpeg::JpegEncoder;
use image::codecs::png::PngEncoder;
use image::codecs::webp::WebPEncoder;
use image::{ExtendedColorType, ImageEncoder};

use crate::Error;

/// An image file format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageFormat {
    /// PNG (lossless).
    Png,
    /// JPEG at the request's quality.
    Jpeg,
    /// WebP, lossless.
    Webp,
}

impl ImageFormat {
    /// The format `name` (`png`, `jpeg` or `jpg`, `webp`) names.
    pub fn parse(name: &str) -> Option<ImageFormat> {
        match name.to_ascii_lowercase().as_str() {
            "png" => Some(ImageFormat::Png),
            "jpeg" | "jpg" => Some(ImageFormat::Jpeg),
            "webp" => Some(ImageFormat::Webp),
            _ => None,
        }
    }

    /// Its name in OpenAI's `output_format`.
    pub fn as_str(self) -> &'static str {
        match self {
            ImageFormat::Png => "png",
            ImageFormat::Jpeg => "jpeg",
            ImageFormat::Webp => "webp",
        }
    }

    /// Its media type.
    pub fn content_type(self) -> &'static str {
        match self {
            ImageFormat::Png => "image/png",
            ImageFormat::Jpeg => "image/jpeg",
            ImageFormat::Webp => "image/webp",
        }
    }
}

/// Encodes `rgb` (`width × height` pixels, 3 bytes each) as `format`; `quality` (1 to
/// 100) is JPEG's.
pub fn encode(
    rgb: &[u8],
    width: u32,
    height: u32,
    format: ImageFormat,
    quality: u8,
) -> Result<Vec<u8>, Error> {
    let expected = width as usize * height as usize * 3;
    if rgb.len() != expected {
        return Err(Error::Failed {
            reason: format!(
                "{} bytes of pixels for a {width}x{height} RGB image of {expected}",
                rgb.len()
            ),
        });
    }
    let mut out = Cursor::new(Vec::new());
    let color = ExtendedColorType::Rgb8;
    let written = match format {
        ImageFormat::Png => PngEncoder::new(&mut out).write_image(rgb, width, height, color),
        ImageFormat::Jpeg => JpegEncoder::new_with_quality(&mut out, quality.clamp(1, 100))
            .write_image(rgb, width, height, color),
        ImageFormat::Webp => {
            WebPEncoder::new_lossless(&mut out).write_image(rgb, width, height, color)
        }
    };
    written.map_err(|e| Error::Failed {
        reason: format!("encoding the image as {}: {e}", format.as_str()),
    })?;
    Ok(out.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_format_starts_with_its_signature() {
        let rgb: Vec<u8> = (0..64 * 64 * 3).map(|i| (i % 251) as u8).collect();
        let png = encode(&rgb, 64, 64, ImageFormat::Png, 90).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        let jpeg = encode(&rgb, 64, 64, ImageFormat::Jpeg, 90).unwrap();
        assert_eq!(&jpeg[..3], b"\xff\xd8\xff");
        let webp = encode(&rgb, 64, 64, ImageFormat::Webp, 90).unwrap();
        assert_eq!((&webp[..4], &webp[8..12]), (&b"RIFF"[..], &b"WEBP"[..]));
        assert!(encode(&rgb[..10], 64, 64, ImageFormat::Png, 90).is_err());
    }
}
