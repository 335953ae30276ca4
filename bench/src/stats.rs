//! The small arithmetic every benchmark shares: medians, milliseconds, ratios.

use std::time::Duration;

/// Milliseconds, fractional.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The upper median (the middle element, or the higher of the two middle ones); `None` for
/// no values. Incomparable values (NaN) compare as equal to everything.
pub fn median<T: Copy + PartialOrd>(v: &[T]) -> Option<T> {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    s.get(s.len() / 2).copied()
}

/// `a / b` with `b` kept at least `floor`, so a zero-length measurement gives a large,
/// finite ratio instead of infinity.
pub fn ratio(a: f64, b: f64, floor: f64) -> f64 {
    a / b.max(floor)
}

/// The arithmetic mean; 0 for no values.
pub fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_is_the_upper_middle() {
        assert_eq!(median(&[3, 1, 2]), Some(2));
        assert_eq!(median(&[4, 1, 3, 2]), Some(3));
        assert_eq!(median::<u64>(&[]), None);
        let d = [Duration::from_millis(30), Duration::from_millis(10)];
        assert_eq!(median(&d), Some(Duration::from_millis(30)));
    }

    #[test]
    fn ratios_and_means_stay_finite() {
        assert_eq!(ratio(10.0, 0.0, 1e-3), 10_000.0);
        assert_eq!(ratio(10.0, 4.0, 1e-3), 2.5);
        assert_eq!(mean(&[]), 0.0);
        assert_eq!(mean(&[1.0, 2.0, 6.0]), 3.0);
        assert_eq!(ms(Duration::from_micros(1500)), 1.5);
    }
}
