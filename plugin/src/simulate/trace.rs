//! Reading an Alibaba "openb" trace (node list and pod list CSVs).
//!
//! Columns are found by their header names, so extra columns and any
//! column order are accepted. Node lists need `sn,cpu_milli,memory_mib,
//! gpu,model`; pod lists need `name,cpu_milli,memory_mib,num_gpu,
//! gpu_milli` and may have `gpu_spec` (allowed models separated by `|`;
//! empty = any). Fields are plain (no quoting). Every error names the
//! file, line and column.

use std::path::{Path, PathBuf};

use thiserror::Error;

use crate::placement::{Gpu, GpuAsk, Models, Node, Pool, Task, WHOLE_GPU};
use crate::resources::Memory;

/// Why a trace file could not be read.
#[derive(Debug, Error)]
pub enum TraceError {
    /// The file could not be read.
    #[error("{}: cannot read", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The header lacks a needed column.
    #[error("{}: line 1: missing column {column:?} (header has: {header})", path.display())]
    MissingColumn {
        /// The file.
        path: PathBuf,
        /// The column name.
        column: &'static str,
        /// The header as read.
        header: String,
    },
    /// A record is malformed or a value is out of range.
    #[error("{}: line {line}, column {column:?}: {problem}", path.display())]
    Field {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// The column name (or `record` for the record as a whole).
        column: String,
        /// What is wrong, with the value.
        problem: String,
    },
    /// The file has a header but no record.
    #[error("{}: no records after the header", path.display())]
    Empty {
        /// The file.
        path: PathBuf,
    },
}

/// One task of a pod list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceTask {
    /// Its `name`.
    pub name: String,
    /// What it asks of a node.
    pub task: Task,
}

struct Table<'a> {
    path: &'a Path,
    columns: Vec<&'a str>,
    rows: Vec<(usize, Vec<&'a str>)>,
}

fn read(path: &Path) -> Result<String, TraceError> {
    std::fs::read_to_string(path).map_err(|source| TraceError::Read {
        path: path.to_owned(),
        source,
    })
}

fn table<'a>(path: &'a Path, text: &'a str) -> Result<Table<'a>, TraceError> {
    let mut lines = text.lines().enumerate();
    let header = lines.next().map(|(_, l)| l).unwrap_or("");
    let header = header.strip_prefix('\u{feff}').unwrap_or(header);
    let columns: Vec<&str> = header.split(',').map(str::trim).collect();
    let mut rows = Vec::new();
    for (i, line) in lines {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.trim().is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        if fields.len() != columns.len() {
            return Err(TraceError::Field {
                path: path.to_owned(),
                line: i + 1,
                column: "record".into(),
                problem: format!(
                    "{} fields, header has {} (quoted fields are not supported)",
                    fields.len(),
                    columns.len()
                ),
            });
        }
        rows.push((i + 1, fields));
    }
    if rows.is_empty() {
        return Err(TraceError::Empty {
            path: path.to_owned(),
        });
    }
    Ok(Table {
        path,
        columns,
        rows,
    })
}

impl Table<'_> {
    fn column(&self, name: &'static str) -> Result<usize, TraceError> {
        self.columns
            .iter()
            .position(|c| *c == name)
            .ok_or_else(|| TraceError::MissingColumn {
                path: self.path.to_owned(),
                column: name,
                header: self.columns.join(","),
            })
    }

    fn error(&self, line: usize, column: &str, problem: String) -> TraceError {
        TraceError::Field {
            path: self.path.to_owned(),
            line,
            column: column.to_owned(),
            problem,
        }
    }

    fn number(
        &self,
        line: usize,
        fields: &[&str],
        col: usize,
        max: u64,
    ) -> Result<u64, TraceError> {
        let name = self.columns[col];
        let value = fields[col];
        let n: u64 = value
            .parse()
            .map_err(|_| self.error(line, name, format!("{value:?} is not a whole number ≥ 0")))?;
        if n > max {
            return Err(self.error(line, name, format!("{n} is above the most accepted, {max}")));
        }
        Ok(n)
    }
}

/// Most GPUs on one node or for one task.
pub const MAX_GPUS: u64 = 64;
/// Largest CPU or memory figure accepted (milli-cores, MiB).
pub const MAX_AMOUNT: u64 = 1 << 40;

/// Reads a node list: each node with its CPU, memory and `gpu` GPUs of
/// `model`, all empty. GPU memory is not in the trace and is not tracked.
///
/// # Errors
/// A [`TraceError`] naming the file, line and column.
pub fn read_nodes(path: &Path) -> Result<Vec<Node>, TraceError> {
    let text = read(path)?;
    let t = table(path, &text)?;
    let (sn, cpu, mem, gpu, model) = (
        t.column("sn")?,
        t.column("cpu_milli")?,
        t.column("memory_mib")?,
        t.column("gpu")?,
        t.column("model")?,
    );
    let mut nodes = Vec::with_capacity(t.rows.len());
    for (line, f) in &t.rows {
        let line = *line;
        if f[sn].is_empty() {
            return Err(t.error(line, "sn", "empty node name".into()));
        }
        let count = t.number(line, f, gpu, MAX_GPUS)?;
        if count > 0 && f[model].is_empty() {
            return Err(t.error(
                line,
                "model",
                format!("empty, but the node has {count} GPU(s)"),
            ));
        }
        let gpus = (0..count)
            .map(|i| Gpu {
                uuid: format!("{}/gpu{i}", f[sn]).into(),
                model: f[model].into(),
                memory_mib: 0,
                used_mib: 0,
                used_milli: 0,
                healthy: true,
                ..Gpu::default()
            })
            .collect();
        nodes.push(Node {
            name: f[sn].into(),
            cpu_milli: Some(Pool {
                capacity: t.number(line, f, cpu, MAX_AMOUNT)?,
                used: 0,
            }),
            memory_mib: Some(Pool {
                capacity: t.number(line, f, mem, MAX_AMOUNT)?,
                used: 0,
            }),
            gpus,
        });
    }
    Ok(nodes)
}

/// Reads a pod list. `num_gpu` GPUs of `gpu_milli` each: `num_gpu` 0 needs
/// `gpu_milli` 0, and `num_gpu` ≥ 1 needs `gpu_milli` in 1..=1000.
///
/// # Errors
/// A [`TraceError`] naming the file, line and column.
pub fn read_pods(path: &Path) -> Result<Vec<TraceTask>, TraceError> {
    let text = read(path)?;
    let t = table(path, &text)?;
    let (name, cpu, mem, num, milli) = (
        t.column("name")?,
        t.column("cpu_milli")?,
        t.column("memory_mib")?,
        t.column("num_gpu")?,
        t.column("gpu_milli")?,
    );
    let spec = t.column("gpu_spec").ok();
    let mut tasks = Vec::with_capacity(t.rows.len());
    for (line, f) in &t.rows {
        let line = *line;
        let count = t.number(line, f, num, MAX_GPUS)?;
        let gpu_milli = t.number(line, f, milli, u64::from(WHOLE_GPU))?;
        if count == 0 && gpu_milli != 0 {
            return Err(t.error(
                line,
                "gpu_milli",
                format!("{gpu_milli} with num_gpu 0; accepted: 0 for a task without GPU"),
            ));
        }
        if count > 0 && gpu_milli == 0 {
            return Err(t.error(
                line,
                "gpu_milli",
                format!("0 with num_gpu {count}; accepted: 1..=1000 per GPU"),
            ));
        }
        let models = match spec {
            Some(s) if !f[s].is_empty() => {
                let names: Vec<String> = f[s].split('|').map(|m| m.trim().to_owned()).collect();
                if names.iter().any(String::is_empty) {
                    return Err(t.error(
                        line,
                        "gpu_spec",
                        format!(
                            "{:?} has an empty model name; accepted: models separated by |",
                            f[s]
                        ),
                    ));
                }
                Models::OneOf(names)
            }
            _ => Models::OneOf(Vec::new()),
        };
        let gpus = if count == 0 {
            Vec::new()
        } else {
            vec![GpuAsk {
                container: String::new(),
                // Both bounded by MAX_GPUS and WHOLE_GPU above.
                count: u32::try_from(count).unwrap_or(u32::MAX),
                memory: Memory::Mib(0),
                milli: u32::try_from(gpu_milli).unwrap_or(WHOLE_GPU),
                numa_bind: false,
                elastic: false,
            }]
        };
        tasks.push(TraceTask {
            name: f[name].to_owned(),
            task: Task {
                cpu_milli: t.number(line, f, cpu, MAX_AMOUNT)?,
                memory_mib: t.number(line, f, mem, MAX_AMOUNT)?,
                gpus,
                models,
                uuids: Default::default(),
            },
        });
    }
    Ok(tasks)
}
