//! The plot of throughput against snapshot depth, Lamina beside qcow2,
//! drawn from the depth case's records (target `name@depth`).

use super::record::Records;
use anyhow::{anyhow, Result};
use plotters::prelude::*;
use std::collections::BTreeMap;
use std::path::Path;

const FONTS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
];

fn register_font() -> bool {
    for f in FONTS {
        if let Ok(bytes) = std::fs::read(f) {
            // plotters keeps the font for the life of the process.
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                return true;
            }
        }
    }
    false
}

/// Series per metric: name → (depth, median).
type Panels = BTreeMap<String, BTreeMap<String, Vec<(usize, f64)>>>;

fn panels(rec: &Records) -> Panels {
    let mut p = Panels::new();
    for r in rec
        .records
        .iter()
        .filter(|r| r.case == "depth" && r.unit == "IOPS")
    {
        let Some((name, depth)) = r.target.split_once('@') else {
            continue;
        };
        let Ok(depth) = depth.parse::<usize>() else {
            continue;
        };
        p.entry(format!("{} ({})", r.metric, r.unit))
            .or_default()
            .entry(name.to_string())
            .or_default()
            .push((depth, r.median()));
    }
    for series in p.values_mut() {
        for pts in series.values_mut() {
            pts.sort_by_key(|x| x.0);
        }
    }
    p
}

/// Draw the plot; false (and no file) when there is nothing to draw or no
/// font to label it with.
pub fn depth(rec: &Records, path: &Path) -> Result<bool> {
    let p = panels(rec);
    if p.is_empty() {
        return Ok(false);
    }
    if !register_font() {
        eprintln!("  no TrueType font found ({}): no plot", FONTS.join(", "));
        return Ok(false);
    }
    draw(&p, path).map_err(|e| anyhow!("drawing {}: {e}", path.display()))?;
    Ok(true)
}

fn draw(p: &Panels, path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let root = BitMapBackend::new(path, (560 * p.len() as u32, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let areas = root.split_evenly((1, p.len()));
    // Depths on a log-like axis: each distinct depth gets one slot.
    let mut depths: Vec<usize> = p
        .values()
        .flat_map(|s| s.values().flat_map(|v| v.iter().map(|x| x.0)))
        .collect();
    depths.sort();
    depths.dedup();
    let slot = |d: usize| depths.iter().position(|x| *x == d).unwrap_or(0) as f64;
    let colors = [
        RGBColor(0, 114, 178),
        RGBColor(213, 94, 0),
        RGBColor(0, 158, 115),
        RGBColor(204, 121, 167),
    ];
    for (area, (metric, series)) in areas.iter().zip(p) {
        let ymax = series
            .values()
            .flat_map(|v| v.iter().map(|x| x.1))
            .fold(0.0f64, f64::max)
            * 1.15;
        let mut chart = ChartBuilder::on(area)
            .caption(metric.as_str(), ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(-0.3f64..(depths.len() as f64 - 0.7), 0.0..ymax.max(1.0))?;
        let labels = depths.clone();
        chart
            .configure_mesh()
            .x_desc("snapshots in the chain")
            .x_labels(depths.len())
            .x_label_formatter(&|x| {
                let i = x.round();
                if (x - i).abs() < 0.01 && i >= 0.0 && (i as usize) < labels.len() {
                    labels[i as usize].to_string()
                } else {
                    String::new()
                }
            })
            .y_label_formatter(&|y| format!("{:.0}k", y / 1000.0))
            .draw()?;
        for (i, (name, pts)) in series.iter().enumerate() {
            let c = colors[i % colors.len()];
            let xy: Vec<(f64, f64)> = pts.iter().map(|(d, v)| (slot(*d), *v)).collect();
            chart
                .draw_series(LineSeries::new(xy.clone(), c.stroke_width(2)))?
                .label(name.as_str())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2))
                });
            chart.draw_series(xy.iter().map(|p| Circle::new(*p, 4, c.filled())))?;
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .position(SeriesLabelPosition::LowerLeft)
            .draw()?;
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::suite::record::Better;

    #[test]
    fn draws_a_png_from_depth_records() {
        let mut r = Records::default();
        for (t, v) in [
            ("lamina@0", 50e3),
            ("lamina@100", 49e3),
            ("qcow2@0", 30e3),
            ("qcow2@10", 20e3),
        ] {
            r.add("depth", t, "4k randread QD32", "IOPS", Better::Higher, v);
        }
        r.add(
            "io",
            "lamina",
            "4k randread QD32",
            "IOPS",
            Better::Higher,
            1.0,
        );
        let p = panels(&r);
        assert_eq!(p.len(), 1);
        assert_eq!(
            p.values().next().unwrap()["qcow2"],
            vec![(0, 30e3), (10, 20e3)]
        );
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("x.png");
        if depth(&r, &f).unwrap() {
            let bytes = std::fs::read(&f).unwrap();
            assert_eq!(&bytes[1..4], b"PNG");
        }
    }
}
