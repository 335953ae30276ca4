//! The leave-one-out outlier test of seed 002 §4.1. The mean and σ exclude the node under
//! test: including it, Samuelson's inequality bounds any z-score by (n-1)/√n, so a group of
//! five or fewer nodes could never be beyond 2σ.

/// Mean and sample standard deviation of `values` without index `skip`; `None` with fewer
/// than two other values.
pub fn leave_one_out(values: &[f64], skip: usize) -> Option<(f64, f64)> {
    let others: Vec<f64> = values
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != skip)
        .map(|(_, v)| *v)
        .collect();
    if others.len() < 2 {
        return None;
    }
    let n = others.len() as f64;
    let mean = others.iter().sum::<f64>() / n;
    let var = others.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0);
    Some((mean, var.sqrt()))
}

/// Whether `values[idx]` lies more than `sigma` standard deviations above the others' mean
/// and at least `min_gap` above it. Only high outliers matter: low memory never fails a node.
pub fn loo_outlier(values: &[f64], idx: usize, sigma: f64, min_gap: f64) -> bool {
    let Some((mean, sd)) = leave_one_out(values, idx) else {
        return false;
    };
    let gap = values[idx] - mean;
    gap >= min_gap && gap > sigma * sd
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loo_finds_outlier_in_small_group() {
        // With σ over all 4 nodes the hog's z-score is capped at 3/2 = 1.5 < 2.
        let v = [0.50, 0.52, 0.51, 0.95];
        let all_mean = v.iter().sum::<f64>() / 4.0;
        let all_sd = (v.iter().map(|x| (x - all_mean).powi(2)).sum::<f64>() / 3.0).sqrt();
        assert!((v[3] - all_mean) / all_sd < 2.0);
        assert!(loo_outlier(&v, 3, 2.0, 0.05));
        assert!(!loo_outlier(&v, 0, 2.0, 0.05));
        assert!(!loo_outlier(&[0.5, 0.9], 1, 2.0, 0.0), "needs two others");
        assert!(
            !loo_outlier(&[0.80, 0.80, 0.80, 0.81], 3, 2.0, 0.05),
            "gap too small"
        );
    }
}
