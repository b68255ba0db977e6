//! [`Resampler`]: `rubato`'s band-limited FFT resampler fed piece by piece, for mono
//! audio. Only its output and less than one chunk of input are held, and the output
//! can be taken as it is made ([`Resampler::take`]), so a stream is resampled without
//! waiting for its end; [`Resampler::finish`] runs the last partial chunk and trims the
//! filter's delay, so the whole output is exactly as long as the input's duration at
//! the new rate.

use rubato::audioadapter_buffers::direct::InterleavedSlice;
use rubato::{Fft, FixedSync, Indexing, Resampler as _};

/// The lowest rate resampled from or to, in Hz.
pub const MIN_RATE: u32 = 1_000;

/// The highest rate resampled from or to, in Hz (a resampler's FFT grows with the
/// ratio of the two rates, so a hostile rate must never reach here).
pub const MAX_RATE: u32 = 384_000;

/// A mono resampler from one rate to another (see the module docs).
pub struct Resampler {
    /// `None` when both rates are equal: samples are kept as they are.
    fft: Option<Fft<f32>>,
    pending: Vec<f32>,
    scratch: Vec<f32>,
    output: Vec<f32>,
    input_frames: usize,
    /// Frames of the filter's delay still to drop from the output's start.
    delay_left: usize,
    /// Frames given out so far (by [`Resampler::take`]).
    given: usize,
}

impl std::fmt::Debug for Resampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resampler")
            .field("input_frames", &self.input_frames)
            .field("given", &self.given)
            .finish_non_exhaustive()
    }
}

impl Resampler {
    /// A resampler from `from` Hz to `to` Hz; both must lie in
    /// [`MIN_RATE`]..=[`MAX_RATE`] (the error names the one that does not).
    pub fn new(from: u32, to: u32) -> Result<Resampler, String> {
        for rate in [from, to] {
            if !(MIN_RATE..=MAX_RATE).contains(&rate) {
                return Err(format!(
                    "cannot resample at {rate} Hz (rates from {MIN_RATE} to {MAX_RATE} Hz)"
                ));
            }
        }
        let fft = (from != to)
            .then(|| {
                Fft::<f32>::new(from as usize, to as usize, 1024, 1, FixedSync::Input)
                    .map_err(|e| e.to_string())
            })
            .transpose()?;
        let scratch = vec![0.0; fft.as_ref().map_or(0, |f| f.output_frames_max())];
        let delay_left = fft.as_ref().map_or(0, |f| f.output_delay());
        Ok(Resampler {
            fft,
            pending: Vec::new(),
            scratch,
            output: Vec::new(),
            input_frames: 0,
            delay_left,
            given: 0,
        })
    }

    /// Feeds `samples`.
    pub fn push(&mut self, samples: &[f32]) -> Result<(), String> {
        self.input_frames += samples.len();
        let Some(chunk) = self.fft.as_ref().map(|f| f.input_frames_next()) else {
            self.output.extend_from_slice(samples);
            return Ok(());
        };
        self.pending.extend_from_slice(samples);
        let pending = std::mem::take(&mut self.pending);
        let mut pieces = pending.chunks_exact(chunk);
        for piece in &mut pieces {
            self.process(piece, None)?;
        }
        self.pending = pieces.remainder().to_vec();
        Ok(())
    }

    /// The output made so far and not yet taken (the filter's delay already dropped).
    pub fn take(&mut self) -> Vec<f32> {
        self.drop_delay();
        self.given += self.output.len();
        std::mem::take(&mut self.output)
    }

    /// The rest of the output: the last partial chunk run and the filter flushed, so
    /// that everything given out, [`Resampler::take`] included, is as long as the
    /// input's duration at the new rate.
    pub fn finish(mut self) -> Result<Vec<f32>, String> {
        let Some(ratio) = self.fft.as_ref().map(|f| f.resample_ratio()) else {
            return Ok(self.output);
        };
        let expected = (ratio * self.input_frames as f64).ceil() as usize;
        let pending = std::mem::take(&mut self.pending);
        if !pending.is_empty() {
            self.process(&pending, Some(pending.len()))?;
        }
        loop {
            self.drop_delay();
            if self.delay_left == 0 && self.given + self.output.len() >= expected {
                break;
            }
            self.process(&[], Some(0))?;
        }
        self.output.truncate(expected.saturating_sub(self.given));
        Ok(self.output)
    }

    /// Drops what is left of the filter's delay from the output's start.
    fn drop_delay(&mut self) {
        let dropped = self.delay_left.min(self.output.len());
        self.output.drain(..dropped);
        self.delay_left -= dropped;
    }

    /// Runs one chunk (`partial`: how many frames of a short last one are real).
    fn process(&mut self, input: &[f32], partial: Option<usize>) -> Result<(), String> {
        let Some(fft) = &mut self.fft else {
            return Ok(());
        };
        let source = InterleavedSlice::new(input, 1, input.len()).map_err(|e| e.to_string())?;
        let frames = self.scratch.len();
        let mut sink =
            InterleavedSlice::new_mut(&mut self.scratch, 1, frames).map_err(|e| e.to_string())?;
        let indexing = Indexing {
            input_offset: 0,
            output_offset: 0,
            active_channels_mask: None,
            partial_len: partial,
        };
        let (_, produced) = fft
            .process_into_buffer(&source, &mut sink, Some(&indexing))
            .map_err(|e| e.to_string())?;
        self.output.extend_from_slice(&self.scratch[..produced]);
        Ok(())
    }
}

/// Resamples mono `samples` from `from` Hz to `to` Hz at once.
pub fn resample(samples: &[f32], from: u32, to: u32) -> Result<Vec<f32>, String> {
    let mut resampler = Resampler::new(from, to)?;
    resampler.push(samples)?;
    resampler.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tone(rate: u32, hz: f32, seconds: f32) -> Vec<f32> {
        (0..(rate as f32 * seconds) as usize)
            .map(|i| (i as f32 / rate as f32 * hz * std::f32::consts::TAU).sin() * 0.5)
            .collect()
    }

    #[test]
    fn the_output_lasts_as_long_as_the_input() {
        let input = tone(22_050, 440.0, 1.3);
        let output = resample(&input, 22_050, 48_000).unwrap();
        let expected = (input.len() as f64 * 48_000.0 / 22_050.0).ceil() as usize;
        assert_eq!(output.len(), expected);
        assert_eq!(resample(&input, 22_050, 22_050).unwrap(), input);
    }

    #[test]
    fn taking_as_it_goes_gives_what_resampling_at_once_gives() {
        let input = tone(22_050, 300.0, 2.0);
        let whole = resample(&input, 22_050, 48_000).unwrap();
        let mut resampler = Resampler::new(22_050, 48_000).unwrap();
        let mut streamed = Vec::new();
        for piece in input.chunks(3000) {
            resampler.push(piece).unwrap();
            streamed.extend(resampler.take());
        }
        assert!(!streamed.is_empty(), "nothing came out before the end");
        streamed.extend(resampler.finish().unwrap());
        assert_eq!(streamed.len(), whole.len());
        let worst = streamed
            .iter()
            .zip(&whole)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(worst < 1e-4, "{worst}");
    }

    #[test]
    fn the_delay_is_trimmed_so_a_tone_keeps_its_phase() {
        // A 100 Hz tone resampled keeps its zero crossing at the start: the filter's
        // delay would shift it by tens of samples.
        let output = resample(&tone(16_000, 100.0, 0.5), 16_000, 48_000).unwrap();
        let expected = tone(48_000, 100.0, 0.5);
        let middle = 6_000..18_000;
        let worst = output[middle.clone()]
            .iter()
            .zip(&expected[middle])
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(worst < 0.01, "{worst}");
    }

    #[test]
    fn rates_outside_the_bounds_are_refused_by_name() {
        let error = Resampler::new(2_147_483_647, 16_000).unwrap_err();
        assert!(error.contains("2147483647"), "{error}");
        assert!(Resampler::new(16_000, 0).is_err());
    }
}
