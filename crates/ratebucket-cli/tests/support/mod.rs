//! What the CLI's tests share: input files, running the binary, reading what it wrote.

#![allow(dead_code)]

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::Value;

/// A fresh directory under the system's temporary directory, removed with everything in it
/// when dropped.
pub(crate) struct TempDir(tempfile::TempDir);

impl std::ops::Deref for TempDir {
    type Target = Path;

    fn deref(&self) -> &Path {
        self.0.path()
    }
}

/// A fresh directory for one test, named after it.
pub(crate) fn temp_dir(name: &str) -> TempDir {
    let dir = tempfile::Builder::new()
        .prefix(&format!("ratebucket-cli-{name}-"))
        .tempdir()
        .expect("temp dir");
    TempDir(dir)
}

/// `n` chat requests, `line-0000`..., each tagged with its id in `user` (the fake
/// provider logs it).
pub(crate) fn write_input(dir: &Path, n: usize) -> PathBuf {
    let path = dir.join("input.jsonl");
    let mut text = String::new();
    for i in 0..n {
        let id = format!("line-{i:04}");
        let line = serde_json::json!({
            "custom_id": id,
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": "gpt-4o-mini",
                "messages": [{"role": "user", "content": format!("Say something about {i}.")}],
                "max_tokens": 30,
                "user": id,
            },
        });
        text.push_str(&line.to_string());
        text.push('\n');
    }
    std::fs::write(&path, text).expect("input");
    path
}

/// The binary, running `batch input -o output` against `base_url` with `extra` arguments.
pub(crate) fn spawn(input: &Path, output: &Path, base_url: &str, extra: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_ratebucket"))
        .arg("batch")
        .arg(input)
        .arg("-o")
        .arg(output)
        .args(["--base-url", base_url, "--api-key", "sk-test"])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary starts")
}

/// The output's records, every line checked to be a whole Batch API output record.
pub(crate) fn records(output: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(output).unwrap_or_default();
    text.lines()
        .map(|line| {
            let record: Value = serde_json::from_str(line).expect("each line is JSON");
            assert!(record["id"].as_str().is_some_and(|id| id.starts_with("batch_req_")));
            assert!(record["custom_id"].is_string(), "{record}");
            let response = &record["response"];
            let error = &record["error"];
            match (response.is_null(), error.is_null()) {
                (false, true) => {
                    assert!(response["status_code"].is_u64(), "{record}");
                    assert!(response.get("body").is_some(), "{record}");
                }
                (true, false) => {
                    assert!(error["code"].is_string() && error["message"].is_string());
                }
                _ => panic!("a record has a response or an error: {record}"),
            }
            record
        })
        .collect()
}

/// How many whole lines `output` holds now.
pub(crate) fn count_lines(output: &Path) -> usize {
    std::fs::read(output).map(|bytes| bytes.iter().filter(|&&b| b == b'\n').count()).unwrap_or(0)
}

/// Every request id the journal marks with `kind` (`sent`, `ambiguous`, ...).
pub(crate) fn journal_marks(output: &Path, kind: &str) -> HashSet<String> {
    let mut path = output.as_os_str().to_owned();
    path.push(".journal");
    let text = std::fs::read_to_string(PathBuf::from(path)).unwrap_or_default();
    text.lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter_map(|mark| mark[kind].as_str().map(str::to_owned))
        .collect()
}

/// How many times the provider executed each request (admitted it), by `user` tag.
pub(crate) fn executed(sim: &ratebucket_sim::SimHandle) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for entry in sim.log() {
        if entry.admitted
            && let Some(user) = entry.user
        {
            *counts.entry(user).or_default() += 1;
        }
    }
    counts
}
