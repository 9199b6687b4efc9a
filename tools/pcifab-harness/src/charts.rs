// SPDX-License-Identifier: GPL-2.0-only
//! SVG line charts of `make bench` (Documentation/benchmarks.rst, "Charts"), drawn with
//! plotters' SVG backend. Standalone on purpose: `pcifab-manager-bench` includes this file
//! too (`#[path]`), so it uses nothing of the harness.

use std::path::Path;

use plotters::coord::ranged1d::{AsRangedCoord, Ranged, ValueFormatter};
use plotters::coord::Shift;
use plotters::prelude::*;

/// How an axis maps its values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scale {
    Linear,
    /// Logarithmic, ticks at powers of 10.
    Log10,
    /// Logarithmic, ticks at powers of 2, labelled as byte sizes (4, 64, 1K, 16M).
    Log2Bytes,
}

/// One line: a name for the legend and its (x, y) points.
#[derive(Clone, Debug)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// One plot of a chart.
#[derive(Clone, Debug)]
pub struct Panel {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub x: Scale,
    pub y: Scale,
    pub series: Vec<Series>,
}

const PANEL_W: u32 = 1000;
/// Room for the legend, right of each plot.
const LEGEND_W: u32 = 190;
const PANEL_H: u32 = 460;

/// Writes `panels`, one below the other, under `title` to the SVG file `path`. Points that a
/// log axis cannot show (0, negative) and non-finite ones are left out.
pub fn write_svg(path: &Path, title: &str, panels: &[Panel]) -> Result<(), String> {
    if panels.is_empty() {
        return Err(format!("{}: a chart needs a panel", path.display()));
    }
    let h = 40 + PANEL_H * panels.len() as u32;
    let root = SVGBackend::new(path, (PANEL_W, h)).into_drawing_area();
    let e = |e: &dyn std::fmt::Display| format!("chart {}: {e}", path.display());
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let root = root.titled(title, ("sans-serif", 22)).map_err(|x| e(&x))?;
    for (p, area) in panels.iter().zip(root.split_evenly((panels.len(), 1))) {
        panel(&area, p).map_err(|x| e(&x))?;
    }
    root.present().map_err(|x| e(&x))
}

/// The range of one axis over all of a panel's shown values, padded.
fn range(values: impl Iterator<Item = f64>, scale: Scale) -> std::ops::Range<f64> {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in values {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if !lo.is_finite() {
        return if scale == Scale::Linear {
            0.0..1.0
        } else {
            1.0..10.0
        };
    }
    match scale {
        Scale::Linear => {
            let lo = lo.min(0.0);
            let pad = ((hi - lo) * 0.05).max(if hi == 0.0 { 1.0 } else { hi.abs() * 0.05 });
            lo..hi + pad
        }
        Scale::Log10 | Scale::Log2Bytes => lo / 1.5..hi * 1.5,
    }
}

fn shown(scale: Scale, v: f64) -> bool {
    v.is_finite() && (scale == Scale::Linear || v > 0.0)
}

/// A tick label: byte sizes for `Log2Bytes`, else short numbers (12k, 3.5M).
fn label(scale: Scale, v: f64) -> String {
    let trim = |x: f64| {
        let s = format!("{x:.2}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    };
    if scale == Scale::Log2Bytes {
        return match v {
            v if v >= (1u64 << 30) as f64 => format!("{}G", trim(v / (1u64 << 30) as f64)),
            v if v >= (1 << 20) as f64 => format!("{}M", trim(v / (1 << 20) as f64)),
            v if v >= 1024.0 => format!("{}K", trim(v / 1024.0)),
            v => trim(v),
        };
    }
    match v.abs() {
        a if a >= 1e6 => format!("{}M", trim(v / 1e6)),
        a if a >= 1e4 => format!("{}k", trim(v / 1e3)),
        a if a > 0.0 && a < 0.1 => {
            // Two significant digits.
            let decimals = (-a.log10()).ceil() as usize + 1;
            let s = format!("{v:.decimals$}");
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        }
        _ => trim(v),
    }
}

fn panel(area: &DrawingArea<SVGBackend, Shift>, p: &Panel) -> Result<(), String> {
    let pts = || {
        p.series
            .iter()
            .flat_map(|s| s.points.iter().copied())
            .filter(|&(x, y)| shown(p.x, x) && shown(p.y, y))
    };
    let xr = range(pts().map(|(x, _)| x), p.x);
    let yr = range(pts().map(|(_, y)| y), p.y);
    let log = |r: std::ops::Range<f64>, s: Scale| {
        r.log_scale()
            .base(if s == Scale::Log2Bytes { 2.0 } else { 10.0 })
    };
    match (p.x, p.y) {
        (Scale::Linear, Scale::Linear) => draw(area, p, xr, yr),
        (Scale::Linear, y) => draw(area, p, xr, log(yr, y)),
        (x, Scale::Linear) => draw(area, p, log(xr, x), yr),
        (x, y) => draw(area, p, log(xr, x), log(yr, y)),
    }
}

fn draw<X, Y>(area: &DrawingArea<SVGBackend, Shift>, p: &Panel, x: X, y: Y) -> Result<(), String>
where
    X: AsRangedCoord<Value = f64>,
    Y: AsRangedCoord<Value = f64>,
    X::CoordDescType: Ranged<ValueType = f64> + ValueFormatter<f64>,
    Y::CoordDescType: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    let e = |e: &dyn std::fmt::Display| e.to_string();
    let mut chart = ChartBuilder::on(area)
        .caption(&p.title, ("sans-serif", 17))
        .margin(12)
        .margin_right(LEGEND_W)
        .x_label_area_size(42)
        .y_label_area_size(70)
        .build_cartesian_2d(x, y)
        .map_err(|x| e(&x))?;
    let (xs, ys) = (p.x, p.y);
    chart
        .configure_mesh()
        .x_desc(p.x_label.as_str())
        .y_desc(p.y_label.as_str())
        .x_label_formatter(&|v| label(xs, *v))
        .y_label_formatter(&|v| label(ys, *v))
        .light_line_style(WHITE.mix(0.0))
        .draw()
        .map_err(|x| e(&x))?;
    for (i, s) in p.series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let pts: Vec<(f64, f64)> = s
            .points
            .iter()
            .copied()
            .filter(|&(x, y)| shown(xs, x) && shown(ys, y))
            .collect();
        chart
            .draw_series(LineSeries::new(pts, color.stroke_width(2)).point_size(3))
            .map_err(|x| e(&x))?;
        // The legend right of the plot, in the margin kept for it, never over a line.
        let (x0, y) = ((PANEL_W - LEGEND_W + 8) as i32, 48 + 20 * i as i32);
        area.draw(&PathElement::new(
            vec![(x0, y), (x0 + 22, y)],
            color.stroke_width(2),
        ))
        .map_err(|x| e(&x))?;
        area.draw(&Text::new(
            s.name.as_str(),
            (x0 + 28, y - 6),
            ("sans-serif", 13),
        ))
        .map_err(|x| e(&x))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tags open and close in order (`<?...?>`, comments and `<.../>` aside), one root
    /// element, text and attributes free of a raw `<`.
    fn well_formed(svg: &str) -> Result<(), String> {
        let mut stack: Vec<String> = Vec::new();
        let mut rest = svg.trim();
        let mut roots = 0;
        while let Some(i) = rest.find('<') {
            let end = rest[i..].find('>').ok_or("a tag is not closed")? + i;
            let tag = &rest[i + 1..end];
            rest = &rest[end + 1..];
            if tag.starts_with('?') || tag.starts_with('!') {
                continue;
            }
            if tag.contains('<') {
                return Err(format!("'<' inside tag <{tag}>"));
            }
            if let Some(name) = tag.strip_prefix('/') {
                match stack.pop() {
                    Some(open) if open == name.trim() => {}
                    other => return Err(format!("</{name}> closes {other:?}")),
                }
                continue;
            }
            let name = tag
                .split(|c: char| c.is_whitespace() || c == '/')
                .next()
                .unwrap_or("")
                .to_string();
            if stack.is_empty() {
                roots += 1;
            }
            if !tag.ends_with('/') {
                stack.push(name);
            }
        }
        if !stack.is_empty() {
            return Err(format!("unclosed elements {stack:?}"));
        }
        if roots != 1 {
            return Err(format!("{roots} root elements"));
        }
        Ok(())
    }

    #[test]
    fn renders_series_into_a_well_formed_svg() {
        let dir = std::env::temp_dir().join(format!("pcifab-charts-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("sweep.svg");
        let sizes: [f64; 5] = [4096.0, 65536.0, 1048576.0, 16777216.0, 67108864.0];
        let line = |name: &str, k: f64| Series {
            name: name.into(),
            points: sizes.iter().map(|&s| (s, k * s.sqrt())).collect(),
        };
        let panels = [
            Panel {
                title: "throughput".into(),
                x_label: "bytes".into(),
                y_label: "MiB/s".into(),
                x: Scale::Log2Bytes,
                y: Scale::Log10,
                series: vec![line("fabric copy", 1.0), line("emulator memcpy", 3.0)],
            },
            Panel {
                title: "linear, with a zero and a NaN".into(),
                x_label: "queued".into(),
                y_label: "decisions/s".into(),
                x: Scale::Linear,
                y: Scale::Linear,
                series: vec![Series {
                    name: "256 functions".into(),
                    points: vec![(0.0, 0.0), (1000.0, 120000.0), (2000.0, f64::NAN)],
                }],
            },
        ];
        write_svg(&path, "pcifab bench", &panels).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.trim_start().starts_with("<svg"), "{svg}");
        assert!(svg.trim_end().ends_with("</svg>"), "{svg}");
        well_formed(&svg).unwrap_or_else(|e| panic!("{e}:\n{svg}"));
        // The text of every element.
        let texts: Vec<&str> = svg
            .split('>')
            .filter_map(|t| t.split('<').next())
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .collect();
        for name in [
            "fabric copy",
            "emulator memcpy",
            "256 functions",
            "pcifab bench",
            "16M",
            "120k",
        ] {
            assert!(texts.contains(&name), "{name} missing from {texts:?}");
        }
        assert!(write_svg(&dir.join("none.svg"), "x", &[]).is_err());
        if std::env::var_os("PCIFAB_KEEP_CHART").is_none() {
            std::fs::remove_dir_all(&dir).unwrap();
        }
        assert_eq!(label(Scale::Log2Bytes, 4096.0), "4K");
        assert_eq!(label(Scale::Log2Bytes, 4.0), "4");
        assert_eq!(label(Scale::Log10, 2500.0), "2500");
        assert_eq!(label(Scale::Linear, 1.5e6), "1.5M");
        assert_eq!(label(Scale::Log10, 0.1), "0.1");
        assert_eq!(label(Scale::Log10, 0.01), "0.01");
        assert_eq!(label(Scale::Log10, 0.00042), "0.00042");
        assert_eq!(label(Scale::Log10, 0.25), "0.25");
    }
}
