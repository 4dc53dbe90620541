//! SVG charts with plotters (SVG backend only, its naive font metrics:
//! no font files are read, the viewer renders the text).

use std::path::Path;

use anyhow::{anyhow, Result};
use plotters::coord::ranged1d::SegmentValue;
use plotters::prelude::*;

const SIZE: (u32, u32) = (960, 480);

fn err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("drawing a chart: {e:?}")
}

/// Grouped bars: one group per category, one bar per series; a missing
/// value leaves its slot empty.
pub(super) fn bars(
    path: &Path,
    title: &str,
    y_label: &str,
    categories: &[String],
    series: &[(String, Vec<Option<f64>>)],
) -> Result<()> {
    let n = categories.len();
    // One slot per series plus one of space between groups.
    let k = series.len() + 1;
    let ymax = series.iter().flat_map(|(_, v)| v.iter().flatten()).copied().fold(0.0, f64::max);
    let ymax = if ymax > 0.0 { ymax * 1.1 } else { 1.0 };
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d((0..n * k).into_segmented(), 0f64..ymax)
        .map_err(err)?;
    let label = |v: &SegmentValue<usize>| match v {
        SegmentValue::CenterOf(s) if s % k == (k - 1) / 2 => {
            categories.get(s / k).cloned().unwrap_or_default()
        }
        _ => String::new(),
    };
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n * k)
        .x_label_formatter(&label)
        .y_desc(y_label)
        .draw()
        .map_err(err)?;
    for (j, (name, values)) in series.iter().enumerate() {
        let color = Palette99::pick(j).to_rgba();
        let rects = values.iter().enumerate().filter_map(|(i, v)| {
            let s = i * k + j;
            v.map(|v| {
                Rectangle::new(
                    [(SegmentValue::Exact(s), 0.0), (SegmentValue::Exact(s + 1), v)],
                    color.filled(),
                )
            })
        });
        chart
            .draw_series(rects)
            .map_err(err)?
            .label(name.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], color.filled()));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)
}

/// Lines with points; `x_names` labels integer x positions when given.
pub(super) fn lines(
    path: &Path,
    title: &str,
    (x_label, y_label): (&str, &str),
    x_names: Option<&[&str]>,
    series: &[(String, Vec<(f64, f64)>)],
) -> Result<()> {
    let pts = || series.iter().flat_map(|(_, v)| v.iter());
    let xmax = pts().map(|p| p.0).fold(0.0, f64::max).max(1.0);
    let ymax = pts().map(|p| p.1).fold(0.0, f64::max).max(1e-9) * 1.1;
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..xmax * 1.05, 0f64..ymax)
        .map_err(err)?;
    let fmt = |x: &f64| match x_names {
        Some(names) if (x - x.round()).abs() < 1e-6 => {
            names.get(x.round() as usize).map(|s| s.to_string()).unwrap_or_default()
        }
        Some(_) => String::new(),
        None => format!("{x:.0}"),
    };
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc(y_label)
        .x_labels(x_names.map_or(10, |n| n.len() * 4))
        .x_label_formatter(&fmt)
        .draw()
        .map_err(err)?;
    for (j, (name, points)) in series.iter().enumerate() {
        let color = Palette99::pick(j).to_rgba();
        chart
            .draw_series(LineSeries::new(points.iter().copied(), color.stroke_width(2)))
            .map_err(err)?
            .label(name.as_str())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], color.stroke_width(2)));
        chart
            .draw_series(points.iter().map(|p| Circle::new(*p, 3, color.filled())))
            .map_err(err)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)
}
