//! Markdown tables: number formatting and cell marks.

/// One cell: a number (or pair of numbers) with its marks, or why it is empty.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Cell {
    Value { text: String, best: bool, client_paced: bool },
    Empty(String),
}

impl Cell {
    pub(super) fn render(&self) -> String {
        match self {
            Cell::Value { text, best, client_paced } => {
                let mut s = text.clone();
                if *best {
                    s.push_str(" *");
                }
                if *client_paced {
                    s.push_str(" ‡");
                }
                s
            }
            Cell::Empty(reason) if reason.is_empty() => "–".to_string(),
            Cell::Empty(reason) => format!("– ({reason})"),
        }
    }
}

/// Three significant digits, thousands separated: 12,345 · 123 · 12.3 · 1.23.
pub(super) fn num(v: f64) -> String {
    let a = v.abs();
    if a >= 1000.0 {
        let n = v.round() as i64;
        let digits = n.unsigned_abs().to_string();
        let mut out = String::new();
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i).is_multiple_of(3) {
                out.push(',');
            }
            out.push(c);
        }
        if n < 0 {
            out.insert(0, '-');
        }
        out
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// A markdown table; the first column is left-aligned, the others right.
pub(super) fn markdown(header: &[String], rows: &[(String, Vec<Cell>)]) -> String {
    let mut s = String::new();
    s.push_str(&format!("| {} |\n", header.join(" | ")));
    let align: Vec<&str> = (0..header.len()).map(|i| if i == 0 { ":--" } else { "--:" }).collect();
    s.push_str(&format!("| {} |\n", align.join(" | ")));
    for (label, cells) in rows {
        let cells: Vec<String> = cells.iter().map(Cell::render).collect();
        s.push_str(&format!("| {label} | {} |\n", cells.join(" | ")));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_keep_three_digits() {
        assert_eq!(num(45123.4), "45,123");
        assert_eq!(num(1_234_567.0), "1,234,567");
        assert_eq!(num(123.4), "123");
        assert_eq!(num(12.34), "12.3");
        assert_eq!(num(1.234), "1.23");
        assert_eq!(num(0.0), "0.00");
        assert_eq!(num(-2500.0), "-2,500");
    }

    #[test]
    fn table_marks_and_skips() {
        let header = vec!["scenario".to_string(), "rustle".into(), "nginx".into()];
        let rows = vec![(
            "http-ka-1k, req/s".to_string(),
            vec![
                Cell::Value { text: num(15300.0), best: true, client_paced: true },
                Cell::Empty("no SOCKS".into()),
            ],
        )];
        let t = markdown(&header, &rows);
        assert_eq!(
            t,
            "| scenario | rustle | nginx |\n| :-- | --: | --: |\n\
             | http-ka-1k, req/s | 15,300 * ‡ | – (no SOCKS) |\n"
        );
        assert_eq!(Cell::Empty(String::new()).render(), "–");
    }
}
