//! Line and bar charts as inline SVG (axes, ticks, titles, legends), no scripts, no fonts to
//! fetch: the dashboard file opens anywhere, offline.

use std::fmt::Write as _;

/// Tableau 10: distinguishable, colour-blind friendly enough.
const PALETTE: [&str; 10] = [
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
    "#9c755f", "#bab0ac",
];
const W: f64 = 960.0;
const H: f64 = 360.0;
const LEFT: f64 = 72.0;
const RIGHT: f64 = 170.0;
const TOP: f64 = 20.0;
const BOTTOM: f64 = 56.0;
/// Degrees the x labels of a bar chart are slanted by when they do not fit under their bars.
const SLANT: f64 = 35.0;
/// Characters of a slanted label shown (the rest in its tooltip).
const MAX_LABEL: usize = 32;

/// About how wide a label of `chars` characters is at the charts' 12 px sans-serif.
fn label_width(chars: usize) -> f64 {
    chars as f64 * 6.8
}

/// An x value: a time (epoch milliseconds), a number, or a category.
#[derive(Debug, Clone, PartialEq)]
pub enum X {
    /// A time, epoch milliseconds.
    Time(i64),
    /// A number.
    Number(f64),
    /// A category name.
    Category(String),
}

/// One named series of points.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// The series' name, for the legend.
    pub name: String,
    /// Its points.
    pub points: Vec<(X, f64)>,
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Round tick values covering `lo..=hi`.
fn ticks(lo: f64, hi: f64, count: usize) -> Vec<f64> {
    if hi.partial_cmp(&lo) != Some(std::cmp::Ordering::Greater) {
        return vec![lo];
    }
    let raw = (hi - lo) / count as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(raw);
    let first = (lo / step).ceil() * step;
    (0..=count * 2)
        .map(|i| first + i as f64 * step)
        .take_while(|v| *v <= hi + step * 1e-9)
        .collect()
}

fn fmt_num(v: f64) -> String {
    let a = v.abs();
    if a >= 1e9 {
        format!("{:.1}G", v / 1e9)
    } else if a >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if a >= 1e4 {
        format!("{:.0}k", v / 1e3)
    } else if a >= 100.0 || v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

fn time_label(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map_or_else(String::new, |t| t.format("%H:%M").to_string())
}

/// Opens the SVG and draws the axes, with `bottom` pixels below the plot for the x labels and
/// title (the plot keeps its height: a chart with long labels is taller).
fn frame(out: &mut String, x_title: &str, y_title: &str, y_lo: f64, y_hi: f64, bottom: f64) {
    let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
    let h = TOP + ph + bottom;
    let _ = write!(
        out,
        r##"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {h}" width="{W}" height="{h}" font-family="sans-serif" font-size="12" role="img">"##
    );
    for t in ticks(y_lo, y_hi, 5) {
        let y = TOP + ph - (t - y_lo) / (y_hi - y_lo).max(f64::MIN_POSITIVE) * ph;
        let _ = write!(
            out,
            r##"<line x1="{LEFT}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="#e5e5e5"/><text x="{}" y="{:.1}" text-anchor="end" fill="#444">{}</text>"##,
            LEFT + pw,
            LEFT - 6.0,
            y + 4.0,
            fmt_num(t)
        );
    }
    let _ = write!(
        out,
        r##"<line x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{}" stroke="#333"/><line x1="{LEFT}" x2="{}" y1="{}" y2="{}" stroke="#333"/>"##,
        TOP + ph,
        LEFT + pw,
        TOP + ph,
        TOP + ph
    );
    let _ = write!(
        out,
        r##"<text x="{}" y="{}" text-anchor="middle" fill="#222">{}</text><text transform="translate(16 {}) rotate(-90)" text-anchor="middle" fill="#222">{}</text>"##,
        LEFT + pw / 2.0,
        h - 10.0,
        esc(x_title),
        TOP + ph / 2.0,
        esc(y_title)
    );
}

fn legend(out: &mut String, names: &[&str]) {
    for (i, name) in names.iter().enumerate().take(20) {
        let y = TOP + 6.0 + i as f64 * 18.0;
        let _ = write!(
            out,
            r##"<rect x="{}" y="{y:.1}" width="12" height="12" fill="{}"/><text x="{}" y="{:.1}" fill="#222">{}</text>"##,
            W - RIGHT + 16.0,
            PALETTE[i % PALETTE.len()],
            W - RIGHT + 34.0,
            y + 10.0,
            esc(name)
        );
    }
}

fn y_range(series: &[Series]) -> (f64, f64) {
    let values = series.iter().flat_map(|s| s.points.iter().map(|p| p.1));
    let (lo, hi) = values.fold((0.0f64, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let hi = if hi <= lo {
        lo + 1.0
    } else {
        hi + (hi - lo) * 0.05
    };
    (lo, hi)
}

/// A line chart; x must be times or numbers.
pub fn line_chart(series: &[Series], x_title: &str, y_title: &str) -> String {
    let xs: Vec<f64> = series
        .iter()
        .flat_map(|s| s.points.iter())
        .filter_map(|(x, _)| match x {
            X::Time(ms) => Some(*ms as f64),
            X::Number(n) => Some(*n),
            X::Category(_) => None,
        })
        .collect();
    let is_time = series
        .iter()
        .flat_map(|s| s.points.first())
        .any(|(x, _)| matches!(x, X::Time(_)));
    let x_lo = xs.iter().copied().fold(f64::MAX, f64::min);
    let x_hi = xs.iter().copied().fold(f64::MIN, f64::max);
    let (x_lo, x_hi) = if xs.is_empty() {
        (0.0, 1.0)
    } else if x_hi > x_lo {
        (x_lo, x_hi)
    } else {
        (x_lo - 1.0, x_hi + 1.0)
    };
    let (y_lo, y_hi) = y_range(series);
    let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
    let sx = |x: f64| LEFT + (x - x_lo) / (x_hi - x_lo) * pw;
    let sy = |y: f64| TOP + ph - (y - y_lo) / (y_hi - y_lo) * ph;
    let mut out = String::new();
    frame(&mut out, x_title, y_title, y_lo, y_hi, BOTTOM);
    for i in 0..=5 {
        let x = x_lo + (x_hi - x_lo) * i as f64 / 5.0;
        let label = if is_time {
            time_label(x as i64)
        } else {
            fmt_num(x)
        };
        let _ = write!(
            out,
            r##"<line x1="{0:.1}" x2="{0:.1}" y1="{1}" y2="{2}" stroke="#333"/><text x="{0:.1}" y="{3}" text-anchor="middle" fill="#444">{4}</text>"##,
            sx(x),
            TOP + ph,
            TOP + ph + 5.0,
            TOP + ph + 19.0,
            label
        );
    }
    for (i, s) in series.iter().enumerate() {
        let mut pts: Vec<(f64, f64)> = s
            .points
            .iter()
            .filter_map(|(x, y)| match x {
                X::Time(ms) => Some((*ms as f64, *y)),
                X::Number(n) => Some((*n, *y)),
                X::Category(_) => None,
            })
            .collect();
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        let path: Vec<String> = pts
            .iter()
            .map(|(x, y)| format!("{:.1},{:.1}", sx(*x), sy(*y)))
            .collect();
        let _ = write!(
            out,
            r##"<polyline fill="none" stroke="{}" stroke-width="1.8" points="{}"><title>{}</title></polyline>"##,
            PALETTE[i % PALETTE.len()],
            path.join(" "),
            esc(&s.name)
        );
    }
    let names: Vec<&str> = series.iter().map(|s| s.name.as_str()).collect();
    legend(&mut out, &names);
    out.push_str("</svg>");
    out
}

/// A bar chart over categories; several series become grouped bars.
pub fn bar_chart(series: &[Series], x_title: &str, y_title: &str) -> String {
    let mut categories: Vec<String> = Vec::new();
    for s in series {
        for (x, _) in &s.points {
            let label = match x {
                X::Category(c) => c.clone(),
                X::Time(ms) => time_label(*ms),
                X::Number(n) => fmt_num(*n),
            };
            if !categories.contains(&label) {
                categories.push(label);
            }
        }
    }
    let (y_lo, y_hi) = y_range(series);
    let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
    let sy = |y: f64| TOP + ph - (y - y_lo) / (y_hi - y_lo) * ph;
    let slot = pw / categories.len().max(1) as f64;
    let bar = slot * 0.8 / series.len().max(1) as f64;
    let mut out = String::new();
    // Labels wider than their bar's slot are slanted (and cut past MAX_LABEL characters, the
    // whole label in a tooltip), and the chart grows to hold them.
    let slanted = categories
        .iter()
        .any(|l| label_width(l.chars().count()) > slot - 4.0);
    let longest = categories
        .iter()
        .map(|l| l.chars().count().min(MAX_LABEL))
        .max()
        .unwrap_or(0);
    let bottom = if slanted {
        BOTTOM.max(19.0 + label_width(longest) * SLANT.to_radians().sin() + 30.0)
    } else {
        BOTTOM
    };
    frame(&mut out, x_title, y_title, y_lo, y_hi, bottom);
    for (c, label) in categories.iter().enumerate() {
        let x = LEFT + slot * (c as f64 + 0.5);
        let y = TOP + ph + 19.0;
        if slanted {
            let shown: String = if label.chars().count() > MAX_LABEL {
                label.chars().take(MAX_LABEL - 1).chain(['…']).collect()
            } else {
                label.clone()
            };
            let _ = write!(
                out,
                r##"<text x="{x:.1}" y="{:.1}" text-anchor="end" transform="rotate(-{SLANT} {x:.1} {:.1})" fill="#444"><title>{}</title>{}</text>"##,
                y - 6.0,
                y - 6.0,
                esc(label),
                esc(&shown)
            );
        } else {
            let _ = write!(
                out,
                r##"<text x="{x:.1}" y="{y}" text-anchor="middle" fill="#444">{}</text>"##,
                esc(label)
            );
        }
    }
    for (i, s) in series.iter().enumerate() {
        for (x, y) in &s.points {
            let label = match x {
                X::Category(c) => c.clone(),
                X::Time(ms) => time_label(*ms),
                X::Number(n) => fmt_num(*n),
            };
            let Some(c) = categories.iter().position(|k| *k == label) else {
                continue;
            };
            let left = LEFT + slot * c as f64 + slot * 0.1 + bar * i as f64;
            let (top, bottom) = (sy(y.max(0.0)), sy(y.min(0.0)));
            let _ = write!(
                out,
                r##"<rect x="{left:.1}" y="{top:.1}" width="{:.1}" height="{:.1}" fill="{}"><title>{}: {}</title></rect><text x="{:.1}" y="{:.1}" text-anchor="middle" fill="#222" font-size="11">{}</text>"##,
                bar.max(1.0),
                (bottom - top).max(0.5),
                PALETTE[i % PALETTE.len()],
                esc(&label),
                fmt_num(*y),
                left + bar / 2.0,
                top - 4.0,
                fmt_num(*y)
            );
        }
    }
    let names: Vec<&str> = series.iter().map(|s| s.name.as_str()).collect();
    if series.len() > 1 {
        legend(&mut out, &names);
    }
    out.push_str("</svg>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round_and_cover_the_range() {
        assert_eq!(
            ticks(0.0, 100.0, 5),
            vec![0.0, 20.0, 40.0, 60.0, 80.0, 100.0]
        );
        let t = ticks(0.0, 7.3, 5);
        assert_eq!(t.first(), Some(&0.0));
        assert!(t.last().is_some_and(|v| *v <= 7.3));
    }

    #[test]
    fn a_line_chart_has_one_polyline_per_series_and_a_legend() {
        let s = |name: &str| Series {
            name: name.into(),
            points: vec![(X::Time(0), 1.0), (X::Time(60_000), 3.0)],
        };
        let svg = line_chart(&[s("DE"), s("FR")], "minute", "orders");
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains(">DE</text>") && svg.contains(">FR</text>"));
        assert!(svg.contains(">00:00<") && svg.contains(">minute</text>"));
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
    }

    #[test]
    fn a_bar_chart_has_one_bar_per_category_and_escapes_labels() {
        let s = Series {
            name: "rate".into(),
            points: vec![
                (X::Category("card".into()), 93.5),
                (X::Category("a<b".into()), 90.0),
            ],
        };
        let svg = bar_chart(&[s], "method", "success %");
        assert_eq!(svg.matches("<rect").count(), 2);
        assert!(svg.contains("a&lt;b"));
        assert!(!svg.contains("rotate(-35"), "short labels stay level");
    }

    /// Many long categories (the dead letters' reasons) would overlap level: they are slanted,
    /// cut with the whole label in a tooltip, and the chart grows to hold them.
    #[test]
    fn bar_labels_that_do_not_fit_their_bars_are_slanted_and_the_chart_grows() {
        let reasons = [
            "empty_value",
            "invalid_base64",
            "invalid_json",
            "missing_required_field",
            "not_an_object",
            "null_value",
            "type_mismatch",
            "late",
            "transform",
            "schema_not_found_in_the_registry_for_this_record",
        ];
        let s = Series {
            name: "records".into(),
            points: reasons
                .iter()
                .map(|r| (X::Category(r.to_string()), 3.0))
                .collect(),
        };
        let svg = bar_chart(&[s], "reason", "records");
        assert_eq!(svg.matches("rotate(-35").count(), reasons.len());
        let height: f64 = svg
            .split("height=\"")
            .nth(1)
            .and_then(|h| h.split('"').next())
            .and_then(|h| h.parse().ok())
            .expect("height");
        let longest = label_width(MAX_LABEL) * SLANT.to_radians().sin();
        assert!(height >= H - BOTTOM + 19.0 + longest, "{height}");
        assert!(svg.contains("<title>schema_not_found_in_the_registry_for_this_record</title>"));
        assert!(svg.contains(">schema_not_found_in_the_registr…</text>"));
    }
}
