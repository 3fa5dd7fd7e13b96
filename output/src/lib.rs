//! The command line's output forms, shared by the `xcc` binary's commands and the benchmarks
//! (`xcc-bench`): the `--output table|json` choice and an aligned text table.

use clap::ValueEnum;

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum Output {
    Table,
    Json,
}

/// Render rows as an aligned table.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.len());
        }
    }
    let line = |cells: Vec<&str>| {
        cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<w$}", w = widths[i]))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_string()
    };
    let mut out = line(headers.to_vec());
    out.push('\n');
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::table;

    #[test]
    fn columns_are_as_wide_as_their_widest_cell_and_lines_end_without_padding() {
        let rows = vec![
            vec!["east".to_string(), "1".to_string()],
            vec!["a-longer-name".to_string(), "12345".to_string()],
        ];
        assert_eq!(
            table(&["CLUSTER", "N"], &rows),
            "CLUSTER        N\neast           1\na-longer-name  12345\n"
        );
        assert_eq!(table(&["ONLY"], &[]), "ONLY\n");
    }
}
