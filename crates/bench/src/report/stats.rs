//! The few statistics the report needs, kept small and tested: medians of
//! repetitions, percentile selection, which cell of a row is best, and
//! which role set the pace of a run.

use crate::campaign::record::Pace;

/// A role whose CPU was busy at least this share of the window set the pace.
pub const PACE_THRESHOLD: f64 = 0.9;

/// Two medians closer than this share of the larger count as a tie, so that
/// rounding noise does not hand out a star.
pub(crate) const TIE: f64 = 1e-9;

/// Median; the mean of the two middle values for an even count. NaNs are
/// ignored; `None` for no values.
pub fn median(values: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 })
}

/// Nearest-rank percentile (`p` in 0..=100) of sorted values: the smallest
/// value with at least p% of the values at or below it.
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// Which direction is better for a row's numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Better {
    /// Throughput.
    Higher,
    /// CPU per unit of work, memory, latency.
    Lower,
}

/// Marks the best cell(s) of a row: every cell equal to the best (ties all
/// marked); skipped cells (`None`) never. Nothing is marked when fewer than
/// two cells have values, since a best of one says nothing.
pub fn best_of_row(cells: &[Option<f64>], better: Better) -> Vec<bool> {
    let present: Vec<f64> = cells.iter().flatten().copied().filter(|x| !x.is_nan()).collect();
    if present.len() < 2 {
        return vec![false; cells.len()];
    }
    let best = match better {
        Better::Higher => present.iter().copied().fold(f64::MIN, f64::max),
        Better::Lower => present.iter().copied().fold(f64::MAX, f64::min),
    };
    let tol = best.abs() * TIE;
    cells.iter().map(|c| c.is_some_and(|v| (v - best).abs() <= tol)).collect()
}

/// Who set the pace of one run, from the busy shares of the proxy's CPU
/// (of its quota when it has one) and of the client-and-origin CPU. The
/// proxy wins a tie: if it was at its limit, it is what was measured.
pub fn pace_setter(proxy: Option<f64>, client: Option<f64>) -> Pace {
    if proxy.is_some_and(|p| p >= PACE_THRESHOLD) {
        Pace::Proxy
    } else if client.is_some_and(|c| c >= PACE_THRESHOLD) {
        Pace::Client
    } else {
        Pace::None
    }
}

/// True when most runs of a cell were paced by the client or origin: the
/// report's ‡ (the proxy could do at least that much).
pub fn client_paced(paces: &[Pace]) -> bool {
    let n = paces.iter().filter(|p| **p == Pace::Client).count();
    n * 2 > paces.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_odd_even_empty() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[7.0]), Some(7.0));
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[f64::NAN, 5.0]), Some(5.0));
    }

    #[test]
    fn percentile_is_nearest_rank() {
        let v: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), Some(5.0));
        assert_eq!(percentile(&v, 90.0), Some(9.0));
        assert_eq!(percentile(&v, 99.0), Some(10.0));
        assert_eq!(percentile(&v, 0.0), Some(1.0));
        assert_eq!(percentile(&v, 100.0), Some(10.0));
        assert_eq!(percentile(&[], 50.0), None);
    }

    #[test]
    fn best_of_row_directions_ties_and_skips() {
        let row = [Some(10.0), None, Some(30.0), Some(20.0)];
        assert_eq!(best_of_row(&row, Better::Higher), [false, false, true, false]);
        assert_eq!(best_of_row(&row, Better::Lower), [true, false, false, false]);
        let tie = [Some(5.0), Some(5.0), Some(1.0)];
        assert_eq!(best_of_row(&tie, Better::Higher), [true, true, false]);
        assert_eq!(best_of_row(&[Some(1.0), None], Better::Higher), [false, false]);
        assert_eq!(best_of_row(&[None, None], Better::Lower), [false, false]);
        // CPU per request and memory: the smallest wins even when zero.
        assert_eq!(best_of_row(&[Some(0.0), Some(3.0)], Better::Lower), [true, false]);
    }

    #[test]
    fn pace_rule() {
        assert_eq!(pace_setter(Some(0.95), Some(0.99)), Pace::Proxy);
        assert_eq!(pace_setter(Some(0.5), Some(0.92)), Pace::Client);
        assert_eq!(pace_setter(Some(0.5), Some(0.5)), Pace::None);
        assert_eq!(pace_setter(None, None), Pace::None);
        assert_eq!(pace_setter(Some(0.9), None), Pace::Proxy);
        assert!(client_paced(&[Pace::Client, Pace::Client, Pace::Proxy]));
        assert!(!client_paced(&[Pace::Client, Pace::Proxy]));
        assert!(!client_paced(&[]));
    }
}
