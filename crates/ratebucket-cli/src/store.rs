//! The output file and the journal beside it: what was sent, finished or is ambiguous,
//! synced to disk before anything depends on it, and recovered after a crash.
//!
//! The rules that make a batch resumable and each request sent once:
//!
//! - a request's `sent` mark is on disk before the request leaves;
//! - its output record is on disk before the journal says it finished, and the output
//!   file is the truth about what finished (a record written just before a crash counts);
//! - a request marked sent with no output record was in flight when the process died: its
//!   outcome is unknown, so it is recorded as ambiguous and not sent again, unless the run
//!   is told `--retry-ambiguous`;
//! - a record cut short by a crash (a last line with no newline) is dropped on recovery.
//!
//! Writes go through one thread that commits in groups: every record waiting is written,
//! both files are synced once, then every writer is told.

use std::collections::{HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use crate::api::Api;

/// One thing to make durable.
enum Job {
    /// The request is about to leave.
    Sent(String),
    /// The provider answered that it did not take the request (a refusal of the account,
    /// a pause it never came back from): it may be sent again.
    Released(String),
    /// The request's output record (an ambiguous one if `ambiguous`).
    Finished { id: String, record: String, ambiguous: bool },
}

/// The output file and the journal, written by one thread.
pub(crate) struct Store {
    jobs: Option<mpsc::Sender<(Job, async_channel::Sender<io::Result<()>>)>>,
    writer: Option<JoinHandle<()>>,
}

/// What a previous run left.
#[derive(Debug, Default)]
pub(crate) struct Resume {
    /// Requests with an output record: skipped.
    pub(crate) finished: HashSet<String>,
    /// Requests that were in flight when a previous run died, recorded as ambiguous now.
    pub(crate) marked_ambiguous: usize,
    /// Ambiguous requests this run sends again (`--retry-ambiguous`).
    pub(crate) retried: usize,
    /// Every send the journal dates that the provider did not refuse, oldest first: what
    /// it may still be counting (see [`Resume::recent`]).
    pub(crate) sends: Vec<Send>,
    /// The tokens each finished request was charged per token dimension, from its output
    /// record's `usage`.
    pub(crate) usage: HashMap<String, Vec<u64>>,
    /// The model and the priced usage of each finished request whose record reports one.
    pub(crate) billed: HashMap<String, (String, ratebucket_http::price::Billed)>,
}

/// A request the journal says was sent, and when.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Send {
    pub(crate) id: String,
    pub(crate) at: SystemTime,
}

impl Resume {
    /// The sends within `span` before `now`, each with how long ago it left: the provider
    /// may still count them, and they tell where the limiter's buckets stand.
    pub(crate) fn recent(&self, span: Duration, now: SystemTime) -> Vec<(&Send, Duration)> {
        self.sends
            .iter()
            .filter_map(|send| {
                let ago = now.duration_since(send.at).unwrap_or(Duration::ZERO);
                (ago <= span).then_some((send, ago))
            })
            .collect()
    }
}

/// The kinds of journal marks, each `{kind: id}` (a `sent` mark also has `at`).
const MARKS: [&str; 4] = ["sent", "released", "finished", "ambiguous"];

/// A mark's kind and id.
fn mark_of(mark: &Value) -> Option<(&'static str, &str)> {
    MARKS.iter().find_map(|&kind| mark.get(kind).and_then(Value::as_str).map(|id| (kind, id)))
}

/// Milliseconds since the Unix epoch.
fn unix_ms(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The journal beside `output`.
pub(crate) fn journal_path(output: &Path) -> PathBuf {
    let mut name = output.as_os_str().to_owned();
    name.push(".journal");
    PathBuf::from(name)
}

impl Store {
    /// Opens (or creates) `output` and its journal, recovers what a previous run left (its
    /// records in `api`'s output format), and starts the writer.
    pub(crate) fn open(
        output: &Path,
        retry_ambiguous: bool,
        api: Api,
    ) -> io::Result<(Store, Resume)> {
        let journal_path = journal_path(output);
        let mut output_file = open_append(output)?;
        let mut journal = open_append(&journal_path)?;
        let records = read_records(&mut output_file, output)?;
        let marks = read_records(&mut journal, &journal_path)?;

        let mut resume = Resume::default();
        let mut ambiguous_in_output = HashSet::new();
        for record in &records {
            let id = record["custom_id"]
                .as_str()
                .ok_or_else(|| corrupt(output, "a record without custom_id"))?;
            if api.is_ambiguous(record) {
                ambiguous_in_output.insert(id.to_owned());
            }
            resume.finished.insert(id.to_owned());
            if let Some(tokens) = api.recorded_usage(record) {
                resume.usage.insert(id.to_owned(), tokens);
            }
            if let Some(bill) = crate::spend::recorded_bill(api, record) {
                resume.billed.insert(id.to_owned(), bill);
            }
        }
        // The last mark of each request says where it stands.
        let mut last: HashMap<&str, &str> = HashMap::new();
        for mark in &marks {
            let Some((kind, id)) = mark_of(mark) else {
                continue;
            };
            last.insert(id, kind);
            match kind {
                "sent" => {
                    if let Some(ms) = mark["at"].as_u64() {
                        let at = UNIX_EPOCH + Duration::from_millis(ms);
                        resume.sends.push(Send { id: id.to_owned(), at });
                    }
                }
                // A 429: the provider did not take that send.
                "released" => {
                    if let Some(i) = resume.sends.iter().rposition(|s| s.id == id) {
                        resume.sends.remove(i);
                    }
                }
                _ => {}
            }
        }
        resume.sends.sort_by_key(|s| s.at);
        let mut unresolved: Vec<&str> = last
            .iter()
            .filter(|(id, kind)| **kind == "sent" && !resume.finished.contains(**id))
            .map(|(id, _)| *id)
            .collect();
        unresolved.sort_unstable();

        if retry_ambiguous && !ambiguous_in_output.is_empty() {
            // Their records go, so each is written once more, by this run.
            let kept: Vec<String> =
                records.iter().filter(|r| !api.is_ambiguous(r)).map(Value::to_string).collect();
            rewrite(output, &kept)?;
            output_file = open_append(output)?;
            for id in &ambiguous_in_output {
                resume.finished.remove(id);
            }
            resume.retried += ambiguous_in_output.len();
        }
        for id in &unresolved {
            writeln!(journal, "{}", json!({ "ambiguous": id }))?;
            if retry_ambiguous {
                resume.retried += 1;
            } else {
                let record = api.error_record(
                    id,
                    "ambiguous",
                    "sent before the previous run stopped, with no answer recorded: it may \
                     have been executed; run again with --retry-ambiguous to send it again",
                );
                writeln!(output_file, "{record}")?;
                resume.finished.insert((*id).to_owned());
                resume.marked_ambiguous += 1;
            }
        }
        output_file.sync_data()?;
        journal.sync_data()?;

        let (jobs, queue) = mpsc::channel();
        let writer = std::thread::Builder::new()
            .name("ratebucket-store".into())
            .spawn(move || write_loop(&queue, &mut output_file, &mut journal))?;
        Ok((Store { jobs: Some(jobs), writer: Some(writer) }, resume))
    }

    /// Marks `id` as sent, durably: call before the request leaves.
    pub(crate) async fn sent(&self, id: &str) -> io::Result<()> {
        self.commit(Job::Sent(id.to_owned())).await
    }

    /// Marks `id` as not taken by the provider, durably: a later run may send it again.
    pub(crate) async fn released(&self, id: &str) -> io::Result<()> {
        self.commit(Job::Released(id.to_owned())).await
    }

    /// Writes `id`'s output record, durably, and marks it finished (or ambiguous).
    pub(crate) async fn finish(&self, id: &str, record: String, ambiguous: bool) -> io::Result<()> {
        self.commit(Job::Finished { id: id.to_owned(), record, ambiguous }).await
    }

    async fn commit(&self, job: Job) -> io::Result<()> {
        let (ack, done) = async_channel::bounded(1);
        let stopped = || io::Error::other("the store's writer has stopped");
        self.jobs.as_ref().ok_or_else(stopped)?.send((job, ack)).map_err(|_| stopped())?;
        done.recv().await.map_err(|_| stopped())?
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        // Closing the queue ends the writer once it has committed what it holds.
        drop(self.jobs.take());
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
    }
}

type Queue = mpsc::Receiver<(Job, async_channel::Sender<io::Result<()>>)>;

/// Commits jobs in groups: writes everything waiting, syncs, then acknowledges.
fn write_loop(queue: &Queue, output: &mut File, journal: &mut File) {
    while let Ok(first) = queue.recv() {
        let mut group = vec![first];
        group.extend(queue.try_iter());
        let mut out = String::new();
        let mut marks = String::new();
        for (job, _) in &group {
            match job {
                Job::Sent(id) => {
                    let at = unix_ms(SystemTime::now());
                    marks.push_str(&format!("{}\n", json!({ "sent": id, "at": at })));
                }
                Job::Released(id) => {
                    marks.push_str(&format!("{}\n", json!({ "released": id })));
                }
                Job::Finished { id, record, ambiguous } => {
                    out.push_str(record);
                    out.push('\n');
                    let mark = if *ambiguous { "ambiguous" } else { "finished" };
                    marks.push_str(&format!("{}\n", json!({ mark: id })));
                }
            }
        }
        // The output first: it is the truth about what finished.
        let result = (|| {
            if !out.is_empty() {
                output.write_all(out.as_bytes())?;
                output.sync_data()?;
            }
            journal.write_all(marks.as_bytes())?;
            journal.sync_data()
        })();
        for (_, ack) in group {
            let reply = match &result {
                Ok(()) => Ok(()),
                Err(e) => Err(io::Error::new(e.kind(), e.to_string())),
            };
            let _ = ack.send_blocking(reply);
        }
    }
}

fn open_append(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .open(path)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))
}

fn corrupt(path: &Path, what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("{} holds {what}: not written by this tool", path.display()),
    )
}

/// Every whole JSON line of `file`; a last line cut short (no newline) is dropped from the
/// file.
fn read_records(file: &mut File, path: &Path) -> io::Result<Vec<Value>> {
    let mut text = String::new();
    file.seek(SeekFrom::Start(0))?;
    file.read_to_string(&mut text)?;
    let whole = text.rfind('\n').map_or(0, |i| i + 1);
    if whole < text.len() {
        file.set_len(whole as u64)?;
        file.sync_data()?;
    }
    text[..whole]
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).map_err(|_| corrupt(path, "a line that is not JSON")))
        .collect()
}

/// Replaces `path` with `lines`, atomically (a temporary file renamed over it).
fn rewrite(path: &Path, lines: &[String]) -> io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let mut file = File::create(&tmp)?;
    for line in lines {
        writeln!(file, "{line}")?;
    }
    file.sync_all()?;
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        File::open(dir)?.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An output path in a fresh directory, removed when dropped.
    struct Output {
        path: PathBuf,
        _dir: tempfile::TempDir,
    }

    impl std::ops::Deref for Output {
        type Target = Path;

        fn deref(&self) -> &Path {
            &self.path
        }
    }

    impl AsRef<Path> for Output {
        fn as_ref(&self) -> &Path {
            &self.path
        }
    }

    fn temp(name: &str) -> Output {
        let dir = tempfile::Builder::new()
            .prefix(&format!("ratebucket-store-{name}-"))
            .tempdir()
            .expect("temp dir");
        Output { path: dir.path().join("out.jsonl"), _dir: dir }
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().build().expect("runtime")
    }

    fn record(id: &str) -> String {
        json!({"id": "batch_req_0", "custom_id": id, "response": {"status_code": 200, "body": {}}, "error": null})
            .to_string()
    }

    #[test]
    fn a_crash_leaves_sent_requests_ambiguous_and_cut_records_dropped() {
        let output = temp("crash");
        let runtime = runtime();
        {
            let (store, resume) = Store::open(&output, false, Api::OpenAi).expect("open");
            assert!(resume.finished.is_empty());
            runtime.block_on(async {
                store.sent("a").await.expect("sent");
                store.finish("a", record("a"), false).await.expect("done");
                store.sent("b").await.expect("sent");
                store.sent("r").await.expect("sent");
                store.released("r").await.expect("released");
            });
        }
        // A record cut short by the crash.
        let mut file = OpenOptions::new().append(true).open(&output).expect("open");
        file.write_all(br#"{"custom_id":"c","resp"#).expect("write");
        drop(file);

        let (store, resume) = Store::open(&output, false, Api::OpenAi).expect("reopen");
        drop(store);
        assert_eq!(resume.marked_ambiguous, 1);
        assert!(resume.finished.contains("a") && resume.finished.contains("b"));
        assert!(!resume.finished.contains("c"), "the cut record is gone");
        assert!(!resume.finished.contains("r"), "a released request may go again");
        let text = std::fs::read_to_string(&output).expect("read");
        assert_eq!(text.lines().count(), 2);
        assert!(text.ends_with('\n'));
        let b: Value = serde_json::from_str(text.lines().nth(1).unwrap()).expect("json");
        assert_eq!(b["error"]["code"], "ambiguous");

        // With --retry-ambiguous, b's record goes and b is to be sent again.
        let (store, resume) = Store::open(&output, true, Api::OpenAi).expect("reopen");
        drop(store);
        assert_eq!(resume.retried, 1);
        assert!(resume.finished.contains("a") && !resume.finished.contains("b"));
        let text = std::fs::read_to_string(&output).expect("read");
        assert_eq!(text.lines().count(), 1);
    }

    #[test]
    fn the_journal_dates_each_send_the_provider_took() {
        let output = temp("dated");
        let runtime = runtime();
        let before = SystemTime::now() - Duration::from_millis(1);
        {
            let (store, _) = Store::open(&output, false, Api::OpenAi).expect("open");
            runtime.block_on(async {
                store.sent("a").await.expect("sent");
                let usage = json!({"id": "batch_req_0", "custom_id": "a", "response": {"status_code": 200, "body": {"usage": {"total_tokens": 42}}}, "error": null});
                store.finish("a", usage.to_string(), false).await.expect("done");
                store.sent("r").await.expect("sent");
                store.released("r").await.expect("released");
                store.sent("r").await.expect("sent again");
            });
        }
        // A journal written before sends were dated: read, and its send not replayed.
        let mut journal =
            OpenOptions::new().append(true).open(journal_path(&output)).expect("journal");
        writeln!(journal, "{}", json!({ "sent": "old" })).expect("write");
        drop(journal);

        let (store, resume) = Store::open(&output, true, Api::OpenAi).expect("reopen");
        drop(store);
        let ids: Vec<&str> = resume.sends.iter().map(|s| s.id.as_str()).collect();
        assert_eq!(ids, ["a", "r"], "the refused send is not counted, its retry is");
        assert!(resume.sends.iter().all(|s| s.at >= before));
        assert_eq!(resume.usage.get("a"), Some(&vec![42]));
        assert!(resume.finished.contains("a"));
        let recent = resume.recent(Duration::from_secs(60), SystemTime::now());
        assert_eq!(recent.len(), 2);
        let later = SystemTime::now() + Duration::from_secs(120);
        assert!(resume.recent(Duration::from_secs(60), later).is_empty());
    }

    #[test]
    fn anthropic_results_are_recovered_in_their_own_format() {
        let output = temp("anthropic");
        let runtime = runtime();
        {
            let (store, _) = Store::open(&output, false, Api::Anthropic).expect("open");
            runtime.block_on(async {
                store.sent("a").await.expect("sent");
                let done = json!({"custom_id": "a", "result": {"type": "succeeded", "message": {"usage": {"input_tokens": 30, "output_tokens": 12}}}});
                store.finish("a", done.to_string(), false).await.expect("done");
                store.sent("b").await.expect("sent");
            });
        }
        let (store, resume) = Store::open(&output, false, Api::Anthropic).expect("reopen");
        drop(store);
        assert_eq!(resume.marked_ambiguous, 1);
        assert_eq!(resume.usage.get("a"), Some(&vec![30, 12, 42]));
        let text = std::fs::read_to_string(&output).expect("read");
        let b: Value = serde_json::from_str(text.lines().nth(1).expect("b")).expect("json");
        assert_eq!(b["custom_id"], "b");
        assert_eq!(b["result"]["type"], "errored");
        assert_eq!(b["result"]["error"]["error"]["type"], "ambiguous");

        // Told to retry, the ambiguous result is recognised and goes.
        let (store, resume) = Store::open(&output, true, Api::Anthropic).expect("reopen");
        drop(store);
        assert_eq!(resume.retried, 1);
        assert!(!resume.finished.contains("b"));
        let text = std::fs::read_to_string(&output).expect("read");
        assert_eq!(text.lines().count(), 1);
    }

    #[test]
    fn a_file_that_is_not_ours_is_refused() {
        let output = temp("foreign");
        std::fs::write(&output, "not json\n").expect("write");
        let error = Store::open(&output, false, Api::OpenAi).err().expect("refused");
        assert_eq!(error.kind(), io::ErrorKind::InvalidData);
    }
}
