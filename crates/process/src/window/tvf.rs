//! Flink SQL's window table-valued functions, read with DataFusion's parser:
//! `FROM TABLE(TUMBLE(TABLE orders, DESCRIPTOR(created_at), INTERVAL '1' MINUTES))`.
//!
//! The parser has no `TABLE <name>` argument and no `TABLE(…)` wrapper, so the SQL is first
//! rewritten with those four tokens replaced by spaces (positions in messages stay right),
//! which leaves a table function call DataFusion parses: `FROM TUMBLE(orders,
//! DESCRIPTOR(created_at), INTERVAL '1' MINUTES)`. [`take_window`] then replaces that call in
//! the statement with a scan of the source's rows widened by `window_start` and `window_end`.

use crate::df::sql::sqlparser::ast::{
    Expr as SqlExpr, FunctionArg, FunctionArgExpr, Ident, ObjectName, ObjectNamePart, SetExpr,
    Statement, TableFactor,
};
use crate::df::sql::sqlparser::dialect::GenericDialect;
use crate::df::sql::sqlparser::keywords::Keyword;
use crate::df::sql::sqlparser::tokenizer::{Token, Tokenizer};

use crate::spec::parse_duration_ms;

/// The window functions of Flink SQL, and which of them run here.
const WINDOW_FUNCTIONS: [&str; 4] = ["TUMBLE", "HOP", "SESSION", "CUMULATE"];

/// Which windows a row belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WindowKind {
    /// `TUMBLE(…, size)`: consecutive windows of `size`.
    Tumble { size_ms: i64 },
    /// `HOP(…, slide, size)`: windows of `size` starting every `slide`.
    Hop { slide_ms: i64, size_ms: i64 },
    /// `SESSION(…, gap)`: per key, events less than `gap` apart share a window, which ends
    /// `gap` after its last event.
    Session { gap_ms: i64 },
}

/// Most windows one record may belong to (a hopping window's size over its slide): each is
/// an accumulator per key in the partition's state.
pub(crate) const MAX_WINDOWS_PER_ROW: i64 = 1_000;

impl WindowKind {
    /// The window length, ms (a session's gap: the length of a one-event session).
    pub fn size_ms(&self) -> i64 {
        match self {
            WindowKind::Tumble { size_ms } | WindowKind::Hop { size_ms, .. } => *size_ms,
            WindowKind::Session { gap_ms } => *gap_ms,
        }
    }

    /// The starts (µs) of the windows holding event time `t` (µs), latest first.
    pub fn starts(&self, t: i64) -> impl Iterator<Item = i64> + use<> {
        let (slide, count) = match *self {
            WindowKind::Tumble { size_ms } => (size_ms * 1000, 1),
            WindowKind::Hop { slide_ms, size_ms } => (slide_ms * 1000, size_ms / slide_ms.max(1)),
            WindowKind::Session { .. } => (0, 1),
        };
        let last = if slide > 0 {
            t - t.rem_euclid(slide)
        } else {
            t
        };
        (0..count).map(move |k| last - k * slide)
    }
}

impl WindowKind {
    /// The window as a state records it (stable across releases; [`WindowKind`]'s display is
    /// for people).
    pub fn sig(&self) -> String {
        match self {
            WindowKind::Tumble { size_ms } => format!("tumble {size_ms} ms"),
            WindowKind::Hop { slide_ms, size_ms } => {
                format!("hop {size_ms} ms every {slide_ms} ms")
            }
            WindowKind::Session { gap_ms } => format!("session gap {gap_ms} ms"),
        }
    }
}

impl std::fmt::Display for WindowKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WindowKind::Tumble { size_ms } => write!(f, "tumbling {}", human(*size_ms)),
            WindowKind::Hop { slide_ms, size_ms } => {
                write!(f, "hopping {} every {}", human(*size_ms), human(*slide_ms))
            }
            WindowKind::Session { gap_ms } => {
                write!(f, "session (gap {})", human(*gap_ms))
            }
        }
    }
}

/// `90 s`, `5 min`, `1 h`.
pub(crate) fn human(ms: i64) -> String {
    match ms {
        m if m % 3_600_000 == 0 && m > 0 => format!("{} h", m / 3_600_000),
        m if m % 60_000 == 0 && m > 0 => format!("{} min", m / 60_000),
        m if m % 1000 == 0 => format!("{} s", m / 1000),
        m => format!("{m} ms"),
    }
}

/// A window function call found in the SQL.
#[derive(Debug, Clone)]
pub(crate) struct WindowCall {
    pub kind: WindowKind,
    /// The table the call reads.
    pub source: String,
    /// The `DESCRIPTOR(…)` column.
    pub time_column: String,
    /// Byte offset of the call in the SQL.
    pub at: usize,
}

/// `sql` with `TABLE(` … `)` around a window function and `TABLE` before its first argument
/// blanked out; `None` when the SQL calls no window function.
pub(crate) fn blank_table_keywords(sql: &str) -> Option<String> {
    let tokens = Tokenizer::new(&GenericDialect {}, sql)
        .tokenize_with_location()
        .ok()?;
    let offset = |loc: crate::df::sql::sqlparser::tokenizer::Location| {
        byte_offset(sql, loc.line as usize, loc.column as usize)
    };
    let significant: Vec<usize> = (0..tokens.len())
        .filter(|i| !matches!(tokens[*i].token, Token::Whitespace(_)))
        .collect();
    let is_window = |t: &Token| matches!(t, Token::Word(w) if WINDOW_FUNCTIONS.contains(&w.value.to_ascii_uppercase().as_str()));
    let is_table = |t: &Token| matches!(t, Token::Word(w) if w.keyword == Keyword::TABLE);
    let mut blanks: Vec<(usize, usize)> = Vec::new();
    let mut found = false;
    for (n, &i) in significant.iter().enumerate() {
        if !is_window(&tokens[i].token) {
            continue;
        }
        found = true;
        // TABLE ( TUMBLE ( TABLE name …
        if n >= 2
            && is_table(&tokens[significant[n - 2]].token)
            && tokens[significant[n - 1]].token == Token::LParen
        {
            let open = significant[n - 1];
            let mut depth = 0i32;
            let mut close = None;
            for &j in &significant[n - 1..] {
                match tokens[j].token {
                    Token::LParen => depth += 1,
                    Token::RParen => {
                        depth -= 1;
                        if depth == 0 {
                            close = Some(j);
                            break;
                        }
                    }
                    _ => {}
                }
            }
            let outer = significant[n - 2];
            blanks.push((
                offset(tokens[outer].span.start)?,
                offset(tokens[outer].span.end)?,
            ));
            blanks.push((
                offset(tokens[open].span.start)?,
                offset(tokens[open].span.end)?,
            ));
            if let Some(c) = close {
                blanks.push((offset(tokens[c].span.start)?, offset(tokens[c].span.end)?));
            }
        }
        if n + 3 < significant.len()
            && tokens[significant[n + 1]].token == Token::LParen
            && is_table(&tokens[significant[n + 2]].token)
        {
            let t = &tokens[significant[n + 2]];
            blanks.push((offset(t.span.start)?, offset(t.span.end)?));
            // SESSION(TABLE name PARTITION BY keys, …): the session's keys are the GROUP BY
            // keys, so the clause goes (up to the comma that ends the argument).
            if n + 4 < significant.len()
                && matches!(&tokens[significant[n + 4]].token, Token::Word(w) if w.keyword == Keyword::PARTITION)
            {
                let from = offset(tokens[significant[n + 4]].span.start)?;
                let mut depth = 0i32;
                let mut to = from;
                for &j in &significant[n + 4..] {
                    match tokens[j].token {
                        Token::LParen => depth += 1,
                        Token::RParen if depth == 0 => break,
                        Token::RParen => depth -= 1,
                        Token::Comma if depth == 0 => break,
                        _ => {}
                    }
                    to = offset(tokens[j].span.end)?;
                }
                blanks.push((from, to));
            }
        }
    }
    if !found {
        return None;
    }
    let mut out = sql.to_string();
    for (start, end) in blanks {
        if start <= end
            && end <= out.len()
            && out.is_char_boundary(start)
            && out.is_char_boundary(end)
        {
            out.replace_range(start..end, &" ".repeat(end - start));
        }
    }
    Some(out)
}

/// Byte offset of 1-based `line` and character `column` in `text`.
fn byte_offset(text: &str, line: usize, column: usize) -> Option<usize> {
    let mut start = 0;
    for (i, l) in text.split_inclusive('\n').enumerate() {
        if i + 1 == line {
            return Some(
                start
                    + l.char_indices()
                        .nth(column.saturating_sub(1))
                        .map_or(l.len(), |(b, _)| b),
            );
        }
        start += l.len();
    }
    (line == 0 || text.is_empty()).then_some(text.len())
}

/// Replaces the window function call in `FROM` of `statement` with a scan of `scan_name(source)`
/// and returns what it was; `Err` with the fix when the call cannot run.
pub(crate) fn take_window(
    statement: &mut Statement,
    sql: &str,
    scan_name: impl Fn(&str) -> String,
) -> Result<Option<WindowCall>, String> {
    let Statement::Query(query) = statement else {
        return Ok(None);
    };
    let SetExpr::Select(select) = query.body.as_mut() else {
        return Ok(None);
    };
    for from in &mut select.from {
        let TableFactor::Table { name, args, .. } = &mut from.relation else {
            continue;
        };
        let function = name.to_string().to_ascii_uppercase();
        if !WINDOW_FUNCTIONS.contains(&function.as_str()) {
            continue;
        }
        let at = super::super::refuse::find(sql, &[&function]).unwrap_or(0);
        let Some(call_args) = args.take() else {
            continue;
        };
        let args: Vec<String> = call_args
            .args
            .iter()
            .map(|a| match a {
                FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => Ok(e),
                other => Err(format!(
                    "argument {other} of {function} is not a plain argument"
                )),
            })
            .map(|e| e.map(arg_text))
            .collect::<Result<_, _>>()?;
        let usage = match function.as_str() {
            "TUMBLE" => {
                "TABLE(TUMBLE(TABLE <table>, DESCRIPTOR(<event-time column>), INTERVAL '1' MINUTE))"
            }
            "HOP" => {
                "TABLE(HOP(TABLE <table>, DESCRIPTOR(<event-time column>), INTERVAL '1' MINUTE, INTERVAL '5' MINUTES)) (slide, then size)"
            }
            "SESSION" => {
                "TABLE(SESSION(TABLE <table> PARTITION BY <keys>, DESCRIPTOR(<event-time column>), INTERVAL '5' MINUTES)) (the gap)"
            }
            _ => {
                return Err(format!(
                    "{function} windows cannot run here yet; use TUMBLE, HOP or SESSION windows"
                ));
            }
        };
        let expected = if function == "HOP" { 4 } else { 3 };
        if args.len() != expected {
            return Err(format!(
                "{function} takes {expected} arguments here; write {usage}"
            ));
        }
        let time_column = args[1]
            .strip_prefix("DESCRIPTOR(")
            .or_else(|| args[1].strip_prefix("descriptor("))
            .and_then(|r| r.strip_suffix(')'))
            .map(|c| c.trim().trim_matches('"').to_string())
            .ok_or_else(|| format!("the second argument of {function} is DESCRIPTOR(<event-time column>); write {usage}"))?;
        let duration = |text: &str| {
            parse_duration_ms(text)
                .map_err(|e| format!("{function}: {e}"))
                .and_then(|ms| {
                    if ms > 0 {
                        Ok(ms)
                    } else {
                        Err(format!("{function}: a window lasts more than 0"))
                    }
                })
        };
        let kind = if function == "TUMBLE" {
            WindowKind::Tumble {
                size_ms: duration(&args[2])?,
            }
        } else if function == "SESSION" {
            WindowKind::Session {
                gap_ms: duration(&args[2])?,
            }
        } else {
            let (slide_ms, size_ms) = (duration(&args[2])?, duration(&args[3])?);
            if size_ms % slide_ms != 0 {
                return Err(format!(
                    "HOP: the size ({}) must be a multiple of the slide ({}); HOP takes the slide first, then the size",
                    human(size_ms),
                    human(slide_ms)
                ));
            }
            if size_ms / slide_ms > MAX_WINDOWS_PER_ROW {
                return Err(format!(
                    "HOP: a record would belong to {} windows ({} every {}); the limit is {MAX_WINDOWS_PER_ROW} windows per record: use a longer slide (at least {})",
                    size_ms / slide_ms,
                    human(size_ms),
                    human(slide_ms),
                    human((size_ms + MAX_WINDOWS_PER_ROW - 1) / MAX_WINDOWS_PER_ROW)
                ));
            }
            WindowKind::Hop { slide_ms, size_ms }
        };
        let source = args[0].trim_matches('"').to_string();
        *name = ObjectName(vec![ObjectNamePart::Identifier(Ident::new(scan_name(
            &source,
        )))]);
        return Ok(Some(WindowCall {
            kind,
            source,
            time_column,
            at,
        }));
    }
    Ok(None)
}

fn arg_text(e: &SqlExpr) -> String {
    e.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flink_syntax_is_blanked_in_place() {
        let sql = "SELECT * FROM TABLE(TUMBLE(TABLE orders, DESCRIPTOR(created_at), INTERVAL '1' MINUTES)) GROUP BY 1";
        let out = blank_table_keywords(sql).unwrap();
        assert_eq!(out.len(), sql.len());
        assert_eq!(
            out,
            "SELECT * FROM       TUMBLE(      orders, DESCRIPTOR(created_at), INTERVAL '1' MINUTES)  GROUP BY 1"
        );
        assert!(blank_table_keywords("SELECT * FROM orders").is_none());
    }

    #[test]
    fn windows_hold_their_event_times() {
        let tumble = WindowKind::Tumble { size_ms: 60_000 };
        assert_eq!(
            tumble.starts(61_000_000).collect::<Vec<_>>(),
            vec![60_000_000]
        );
        assert_eq!(tumble.starts(-1).collect::<Vec<_>>(), vec![-60_000_000]);
        let hop = WindowKind::Hop {
            slide_ms: 60_000,
            size_ms: 180_000,
        };
        let starts: Vec<i64> = hop.starts(125_000_000).collect();
        assert_eq!(starts, vec![120_000_000, 60_000_000, 0]);
        for s in starts {
            assert!(s <= 125_000_000 && 125_000_000 < s + 180_000_000);
        }
    }
}
