//! Dashboards as code: `infra/dashboards/*.sql`, one query per file with its chart in a header.
//!
//! ```sql
//! -- title: Payment success rate by method
//! -- chart: bar            (line or bar)
//! -- x: method             (a time, number or category column)
//! -- y: success_rate_pct   (one chart per listed column)
//! -- series: country       (optional: one line or bar group per value)
//! SELECT …
//! ```
//!
//! The same files drive `streamtable dashboard` (a self-contained HTML page of SVG charts), the
//! demo's answers in the terminal, and the Athena named queries of the deployment.

pub mod svg;

use std::collections::BTreeMap;
use std::path::Path;

use datafusion::arrow::array::{Array, RecordBatch};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, TimeUnit};

use crate::error::{Error, Result};
use svg::{Series, X};

/// The dashboards shipped in `infra/dashboards`, compiled in as the default.
pub const BUILTIN: [(&str, &str); 8] = [
    (
        "01_orders_per_minute_by_country",
        include_str!("../../../infra/dashboards/01_orders_per_minute_by_country.sql"),
    ),
    (
        "02_payment_success_by_method",
        include_str!("../../../infra/dashboards/02_payment_success_by_method.sql"),
    ),
    (
        "03_temperature_by_site",
        include_str!("../../../infra/dashboards/03_temperature_by_site.sql"),
    ),
    (
        "04_dead_letters_by_kind",
        include_str!("../../../infra/dashboards/04_dead_letters_by_kind.sql"),
    ),
    (
        "05_revenue_eur_by_country",
        include_str!("../../../infra/dashboards/05_revenue_eur_by_country.sql"),
    ),
    (
        "06_order_payments_by_method",
        include_str!("../../../infra/dashboards/06_order_payments_by_method.sql"),
    ),
    (
        "07_sensor_sessions_per_hour",
        include_str!("../../../infra/dashboards/07_sensor_sessions_per_hour.sql"),
    ),
    (
        "08_orders_by_current_status",
        include_str!("../../../infra/dashboards/08_orders_by_current_status.sql"),
    ),
];

/// Line or bar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChartKind {
    /// A line per series over time.
    Line,
    /// Bars per category.
    Bar,
}

/// One dashboard query and how to draw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dashboard {
    /// File stem, e.g. `02_payment_success_by_method`.
    pub name: String,
    /// The chart's title.
    pub title: String,
    /// Line or bar.
    pub chart: ChartKind,
    /// The column on the x axis.
    pub x: String,
    /// The columns on the y axis.
    pub y: Vec<String>,
    /// The column whose values split the rows into series.
    pub series: Option<String>,
    /// The whole file (header comments included), as run.
    pub sql: String,
}

impl Dashboard {
    /// Reads the header of a dashboard file; `name` is its stem (for messages).
    pub fn parse(name: &str, text: &str) -> Result<Dashboard> {
        let mut header: BTreeMap<String, String> = BTreeMap::new();
        for line in text
            .lines()
            .take_while(|l| l.trim_start().starts_with("--"))
        {
            if let Some((k, v)) = line.trim_start().trim_start_matches('-').split_once(':') {
                header.insert(k.trim().to_lowercase(), v.trim().to_string());
            }
        }
        let need = |k: &str| {
            header.get(k).cloned().ok_or_else(|| {
                Error::Config(format!("dashboard {name}: header line `-- {k}: …` is missing; see infra/dashboards/ for the format"))
            })
        };
        let chart = match need("chart")?.as_str() {
            "line" => ChartKind::Line,
            "bar" => ChartKind::Bar,
            other => {
                return Err(Error::Config(format!(
                    "dashboard {name}: chart {other:?} is not line or bar"
                )));
            }
        };
        Ok(Dashboard {
            name: name.to_string(),
            title: need("title")?,
            chart,
            x: need("x")?,
            y: need("y")?
                .split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect(),
            series: header.get("series").cloned().filter(|s| !s.is_empty()),
            sql: text.to_string(),
        })
    }
}

/// The dashboards in `dir` (`*.sql`, by file name), or the built-in ones when `dir` is absent.
pub fn load(dir: Option<&Path>) -> Result<Vec<Dashboard>> {
    let Some(dir) = dir.filter(|d| d.is_dir()) else {
        return BUILTIN
            .iter()
            .map(|(n, t)| Dashboard::parse(n, t))
            .collect();
    };
    let mut paths: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| Error::io("list dashboards", dir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "sql"))
        .collect();
    paths.sort();
    paths
        .iter()
        .map(|p| {
            let text = std::fs::read_to_string(p).map_err(|e| Error::io("read dashboard", p, e))?;
            let stem = p
                .file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or("dashboard");
            Dashboard::parse(stem, &text)
        })
        .collect()
}

fn column<'a>(batch: &'a RecordBatch, name: &str, dash: &str) -> Result<&'a dyn Array> {
    batch
        .column_by_name(name)
        .map(|c| c.as_ref())
        .ok_or_else(|| {
            Error::Config(format!(
                "dashboard {dash}: the query returns no column {name:?}"
            ))
        })
}

fn x_values(a: &dyn Array) -> Result<Vec<Option<X>>> {
    let err = |e| Error::Internal(format!("chart x values: {e}"));
    Ok(match a.data_type() {
        DataType::Timestamp(_, _) | DataType::Date32 | DataType::Date64 => {
            let ms = cast(a, &DataType::Timestamp(TimeUnit::Millisecond, None)).map_err(err)?;
            let ms = cast(&ms, &DataType::Int64).map_err(err)?;
            let ms = ms
                .as_any()
                .downcast_ref::<datafusion::arrow::array::Int64Array>();
            (0..a.len())
                .map(|i| ms.filter(|m| m.is_valid(i)).map(|m| X::Time(m.value(i))))
                .collect()
        }
        t if t.is_numeric() => {
            let f = cast(a, &DataType::Float64).map_err(err)?;
            let f = f
                .as_any()
                .downcast_ref::<datafusion::arrow::array::Float64Array>();
            (0..a.len())
                .map(|i| f.filter(|v| v.is_valid(i)).map(|v| X::Number(v.value(i))))
                .collect()
        }
        _ => strings(a)?
            .into_iter()
            .map(|s| s.map(X::Category))
            .collect(),
    })
}

fn strings(a: &dyn Array) -> Result<Vec<Option<String>>> {
    let s = cast(a, &DataType::Utf8).map_err(|e| Error::Internal(format!("chart labels: {e}")))?;
    let s = s
        .as_any()
        .downcast_ref::<datafusion::arrow::array::StringArray>();
    Ok((0..a.len())
        .map(|i| s.filter(|v| v.is_valid(i)).map(|v| v.value(i).to_string()))
        .collect())
}

fn numbers(a: &dyn Array) -> Result<Vec<Option<f64>>> {
    let f =
        cast(a, &DataType::Float64).map_err(|e| Error::Internal(format!("chart values: {e}")))?;
    let f = f
        .as_any()
        .downcast_ref::<datafusion::arrow::array::Float64Array>();
    Ok((0..a.len())
        .map(|i| f.filter(|v| v.is_valid(i)).map(|v| v.value(i)))
        .collect())
}

/// The series of one y column: one per value of the series column (or one in all).
pub fn series_of(d: &Dashboard, y: &str, batches: &[RecordBatch]) -> Result<Vec<Series>> {
    let mut by_name: BTreeMap<String, Vec<(X, f64)>> = BTreeMap::new();
    for b in batches {
        let xs = x_values(column(b, &d.x, &d.name)?)?;
        let ys = numbers(column(b, y, &d.name)?)?;
        let names = match &d.series {
            Some(s) => strings(column(b, s, &d.name)?)?,
            None => vec![Some(y.to_string()); b.num_rows()],
        };
        for ((x, v), n) in xs.into_iter().zip(ys).zip(names) {
            if let (Some(x), Some(v)) = (x, v) {
                by_name
                    .entry(n.unwrap_or_else(|| "(null)".into()))
                    .or_default()
                    .push((x, v));
            }
        }
    }
    Ok(by_name
        .into_iter()
        .map(|(name, points)| Series { name, points })
        .collect())
}

/// The charts of one dashboard (one per y column), as SVG.
pub fn charts(d: &Dashboard, batches: &[RecordBatch]) -> Result<Vec<(String, String)>> {
    d.y.iter()
        .map(|y| {
            let series = series_of(d, y, batches)?;
            let svg = match d.chart {
                ChartKind::Line => svg::line_chart(&series, &d.x, y),
                ChartKind::Bar => svg::bar_chart(&series, &d.x, y),
            };
            Ok((y.clone(), svg))
        })
        .collect()
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The whole dashboard page: one section per dashboard, its charts and its SQL.
pub fn render_html(results: &[(Dashboard, Vec<RecordBatch>)], subtitle: &str) -> Result<String> {
    let mut body = String::new();
    for (d, batches) in results {
        let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
        body.push_str(&format!("<section><h2>{}</h2>", esc(&d.title)));
        if rows == 0 {
            body.push_str("<p class=\"empty\">No rows yet.</p>");
        } else {
            for (y, svg) in charts(d, batches)? {
                body.push_str(&format!(
                    "<figure><figcaption>{}</figcaption>{svg}</figure>",
                    esc(&y)
                ));
            }
        }
        body.push_str(&format!(
            "<details><summary>SQL ({rows} rows) — infra/dashboards/{}.sql</summary><pre>{}</pre></details></section>",
            esc(&d.name),
            esc(&d.sql)
        ));
    }
    Ok(format!(
        r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>streamtable dashboard</title>
<style>
body {{ font-family: sans-serif; margin: 24px auto; max-width: 1000px; color: #222; background: #fff; }}
h1 {{ font-size: 22px; margin-bottom: 4px; }} .sub {{ color: #666; margin-top: 0; }}
section {{ border-top: 1px solid #ddd; padding: 12px 0; }} h2 {{ font-size: 17px; }}
figure {{ margin: 8px 0; }} figcaption {{ font-size: 13px; color: #555; }}
svg {{ max-width: 100%; height: auto; }} pre {{ background: #f6f6f6; padding: 8px; overflow-x: auto; }}
.empty {{ color: #888; }}
</style></head>
<body><h1>streamtable dashboard</h1><p class="sub">{}</p>
{body}
</body></html>
"#,
        esc(subtitle)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shipped_dashboard_parses() {
        let all = load(None).expect("built-in dashboards");
        assert_eq!(all.len(), BUILTIN.len());
        let orders = &all[0];
        assert_eq!(orders.chart, ChartKind::Line);
        assert_eq!(orders.y, ["order_count", "revenue"]);
        assert_eq!(orders.series.as_deref(), Some("country"));
        let dir = load(Some(Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/infra/dashboards"
        ))))
        .expect("dir");
        assert_eq!(dir, all, "the compiled-in copies match infra/dashboards");
    }

    #[test]
    fn a_missing_header_is_named() {
        let err = Dashboard::parse("x", "-- title: T\nSELECT 1").expect_err("no chart");
        assert!(err.to_string().contains("-- chart:"), "{err}");
    }
}
