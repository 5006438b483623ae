//! An in-process Redis for simulated fleets: the crate's own Lua scripts run unchanged on
//! a real Lua 5.1 interpreter (the one Redis embeds), over hashes kept in memory, with
//! `TIME` read from tokio's clock, so a fleet can run on a paused, virtual clock.
//!
//! It serves what the scripts and the listener use: `EVALSHA` of the crate's scripts
//! (known by their hashes, as if loaded), and inside them `TIME`, `HEXISTS`, `HGET`,
//! `HSET`, `HGETALL`, `HDEL`, `PEXPIRE` (keys never expire here: runs are shorter than
//! the hour the scripts set) and `PUBLISH` to subscriptions made through
//! `Model::subscribe`. Replies follow Redis's conversions from Lua: a number becomes an
//! integer (truncated), a string a bulk string, `true` 1, `false` nil, a table an array.
//! Answers can be made slow (`Model::set_latency`), the server stopped and started
//! (`Model::set_down`), or restarted without its data (`Model::restart`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use mlua::{Lua, Value as LuaValue, Variadic};
use redis::{Cmd, RedisError, RedisResult, Value};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Keys to hashes of fields to values: all the scripts keep.
type Store = BTreeMap<Vec<u8>, BTreeMap<Vec<u8>, Vec<u8>>>;

/// What the interpreter's callbacks reach.
struct Data {
    store: Store,
    /// The clock's reading, in µs since the UNIX epoch, for `TIME`.
    now_us: u64,
    /// Messages published during the script: sent once it returns.
    published: Vec<(Vec<u8>, Vec<u8>)>,
}

/// The server's state: the interpreter, the subscriptions and how it answers.
struct State {
    lua: Lua,
    /// The crate's scripts by their SHA-1, as `SCRIPT LOAD` would have them.
    scripts: BTreeMap<String, String>,
    subscribers: Vec<(Vec<u8>, mpsc::UnboundedSender<Vec<u8>>)>,
    /// How long before a call runs, and how long before its answer is back.
    latency: (Duration, Duration),
    down: bool,
    /// Scripts run, and the instants they ran at (µs of the clock).
    calls: u64,
}

/// An in-process Redis running the crate's scripts on tokio's clock (see the module docs).
#[derive(Clone)]
pub(crate) struct Model {
    state: Arc<Mutex<State>>,
    /// The clock's origin: `TIME` is `epoch_us` plus the time since `origin`.
    origin: Instant,
    epoch_us: u64,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model").field("calls", &self.calls()).finish()
    }
}

impl Model {
    /// A server holding nothing, its clock starting at a fixed date (so runs repeat).
    /// Call it inside a tokio runtime (its clock is tokio's).
    pub(crate) fn new() -> Model {
        let lua = Lua::new();
        lua.set_app_data(Data { store: Store::new(), now_us: 0, published: Vec::new() });
        install(&lua).expect("the redis table installs in a fresh interpreter");
        let scripts = crate::script::bodies()
            .into_iter()
            .map(|body| (redis::Script::new(body).get_hash().to_owned(), body.to_owned()))
            .collect();
        let state = State {
            lua,
            scripts,
            subscribers: Vec::new(),
            latency: (Duration::ZERO, Duration::ZERO),
            down: false,
            calls: 0,
        };
        Model {
            state: Arc::new(Mutex::new(state)),
            origin: Instant::now(),
            epoch_us: 1_800_000_000_000_000,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Answers from now on take `before` to reach the server (a call given up meanwhile
    /// never runs) and `after` to come back (a call given up meanwhile has run).
    pub(crate) fn set_latency(&self, before: Duration, after: Duration) {
        self.lock().latency = (before, after);
    }

    /// Stops the server (`true`: every call and connection fails at once, subscriptions
    /// end) or starts it again with what it held.
    pub(crate) fn set_down(&self, down: bool) {
        let mut state = self.lock();
        state.down = down;
        if down {
            state.subscribers.clear();
        }
    }

    /// Restarts the server without its data: every key gone, every subscription ended.
    pub(crate) fn restart(&self) {
        let mut state = self.lock();
        state.subscribers.clear();
        if let Some(mut data) = state.lua.app_data_mut::<Data>() {
            data.store.clear();
        }
    }

    /// Scripts run so far.
    pub(crate) fn calls(&self) -> u64 {
        self.lock().calls
    }

    /// Whether the server is down.
    pub(crate) fn is_down(&self) -> bool {
        self.lock().down
    }

    /// A subscription to `channel`: the messages published on it, until the server stops
    /// or restarts. `None` while it is down.
    pub(crate) fn subscribe(&self, channel: &[u8]) -> Option<mpsc::UnboundedReceiver<Vec<u8>>> {
        let mut state = self.lock();
        if state.down {
            return None;
        }
        let (sender, receiver) = mpsc::unbounded_channel();
        state.subscribers.push((channel.to_vec(), sender));
        Some(receiver)
    }

    fn now_us(&self) -> u64 {
        let since = Instant::now().saturating_duration_since(self.origin);
        self.epoch_us + u64::try_from(since.as_micros()).unwrap_or(u64::MAX)
    }

    /// Runs `cmd` as the server would, after the latency set.
    pub(crate) async fn call(&self, cmd: &Cmd) -> RedisResult<Value> {
        let args: Vec<Vec<u8>> = cmd
            .args_iter()
            .map(|arg| match arg {
                redis::Arg::Simple(bytes) => bytes.to_vec(),
                _ => b"0".to_vec(),
            })
            .collect();
        let (before, after) = self.lock().latency;
        tokio::time::sleep(before).await;
        let answer = self.run(&args);
        tokio::time::sleep(after).await;
        answer
    }

    fn run(&self, args: &[Vec<u8>]) -> RedisResult<Value> {
        let now_us = self.now_us();
        let mut state = self.lock();
        if state.down {
            return Err(down());
        }
        let name = args.first().map(|a| String::from_utf8_lossy(a).to_ascii_uppercase());
        if name.as_deref() != Some("EVALSHA") {
            return Err(error(format!("the model serves EVALSHA only, not {name:?}")));
        }
        let text = |i: usize| args.get(i).map(|a| String::from_utf8_lossy(a).into_owned());
        let sha = text(1).unwrap_or_default();
        let Some(body) = state.scripts.get(&sha).cloned() else {
            return Err(error(format!("NOSCRIPT {sha}")));
        };
        let keys: usize = text(2).and_then(|n| n.parse().ok()).ok_or_else(|| error("numkeys"))?;
        let rest = args.get(3..).unwrap_or_default();
        if rest.len() < keys {
            return Err(error("fewer keys than numkeys"));
        }
        let (keys, argv) = rest.split_at(keys);
        state.calls += 1;
        let reply = {
            let lua = &state.lua;
            if let Some(mut data) = lua.app_data_mut::<Data>() {
                data.now_us = now_us;
            }
            eval(lua, &body, keys, argv).map_err(|e| error(format!("script: {e}")))?
        };
        let published = state
            .lua
            .app_data_mut::<Data>()
            .map(|mut data| std::mem::take(&mut data.published))
            .unwrap_or_default();
        for (channel, message) in published {
            state.subscribers.retain(|(subscribed, sender)| {
                subscribed != &channel || sender.send(message.clone()).is_ok()
            });
        }
        Ok(reply)
    }
}

impl Default for Model {
    fn default() -> Model {
        Model::new()
    }
}

fn error(message: impl Into<String>) -> RedisError {
    RedisError::from((redis::ErrorKind::Client, "model redis", message.into()))
}

fn down() -> RedisError {
    RedisError::from(std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "model redis down"))
}

/// Runs `body` with `KEYS` and `ARGV` set, and converts its result as Redis does.
fn eval(lua: &Lua, body: &str, keys: &[Vec<u8>], argv: &[Vec<u8>]) -> mlua::Result<Value> {
    let strings = |items: &[Vec<u8>]| -> mlua::Result<mlua::Table> {
        let items = items.iter().map(|i| lua.create_string(i)).collect::<mlua::Result<Vec<_>>>()?;
        lua.create_sequence_from(items)
    };
    lua.globals().set("KEYS", strings(keys)?)?;
    lua.globals().set("ARGV", strings(argv)?)?;
    let result: LuaValue = lua.load(body).call(())?;
    Ok(to_reply(&result))
}

/// A Lua value as Redis replies with it.
fn to_reply(value: &LuaValue) -> Value {
    match value {
        LuaValue::Integer(i) => Value::Int(*i),
        LuaValue::Number(n) => Value::Int(n.trunc() as i64),
        LuaValue::String(s) => Value::BulkString(s.as_bytes().to_vec()),
        LuaValue::Boolean(true) => Value::Int(1),
        LuaValue::Table(table) => {
            let mut items = Vec::new();
            for i in 1.. {
                match table.raw_get::<LuaValue>(i) {
                    Ok(LuaValue::Nil) | Err(_) => break,
                    Ok(item) => items.push(to_reply(&item)),
                }
            }
            Value::Array(items)
        }
        _ => Value::Nil,
    }
}

/// Installs `redis.call` (and `redis.pcall`, the same here) over the store.
fn install(lua: &Lua) -> mlua::Result<()> {
    let call = lua.create_function(|lua, args: Variadic<LuaValue>| {
        let mut words = Vec::with_capacity(args.len());
        for arg in args {
            match lua.coerce_string(arg)? {
                Some(s) => words.push(s.as_bytes().to_vec()),
                None => return Err(mlua::Error::runtime("redis.call: an argument is no string")),
            }
        }
        let mut data = lua
            .app_data_mut::<Data>()
            .ok_or_else(|| mlua::Error::runtime("redis.call: no store"))?;
        command(lua, &mut data, &words)
    })?;
    let redis = lua.create_table()?;
    redis.set("call", call.clone())?;
    redis.set("pcall", call)?;
    lua.globals().set("redis", redis)
}

/// One command inside a script.
fn command(lua: &Lua, data: &mut Data, words: &[Vec<u8>]) -> mlua::Result<LuaValue> {
    let name = words.first().map(|w| String::from_utf8_lossy(w).to_ascii_uppercase());
    let arg = |i: usize| {
        words.get(i).ok_or_else(|| mlua::Error::runtime(format!("{name:?}: too few arguments")))
    };
    let int = |n: usize| LuaValue::Number(n as f64);
    let string = |bytes: &[u8]| lua.create_string(bytes).map(LuaValue::String);
    match name.as_deref() {
        Some("TIME") => {
            let (secs, micros) = (data.now_us / 1_000_000, data.now_us % 1_000_000);
            let reply =
                [string(secs.to_string().as_bytes())?, string(micros.to_string().as_bytes())?];
            Ok(LuaValue::Table(lua.create_sequence_from(reply)?))
        }
        Some("HEXISTS") => {
            let field = arg(2)?;
            let found = data.store.get(arg(1)?).is_some_and(|hash| hash.contains_key(field));
            Ok(int(usize::from(found)))
        }
        Some("HGET") => match data.store.get(arg(1)?).and_then(|hash| hash.get(arg(2).ok()?)) {
            Some(value) => string(value),
            None => Ok(LuaValue::Boolean(false)),
        },
        Some("HSET") => {
            let pairs = words.get(2..).unwrap_or_default();
            if pairs.is_empty() || pairs.len() % 2 != 0 {
                return Err(mlua::Error::runtime("HSET: wrong number of arguments"));
            }
            let hash = data.store.entry(arg(1)?.clone()).or_default();
            let mut added = 0;
            for pair in pairs.chunks(2) {
                if hash.insert(pair[0].clone(), pair[1].clone()).is_none() {
                    added += 1;
                }
            }
            Ok(int(added))
        }
        Some("HGETALL") => {
            let mut items = Vec::new();
            if let Some(hash) = data.store.get(arg(1)?) {
                for (field, value) in hash {
                    items.push(lua.create_string(field)?);
                    items.push(lua.create_string(value)?);
                }
            }
            Ok(LuaValue::Table(lua.create_sequence_from(items)?))
        }
        Some("HDEL") => {
            let key = arg(1)?.clone();
            let mut removed = 0;
            if let Some(hash) = data.store.get_mut(&key) {
                for field in words.get(2..).unwrap_or_default() {
                    removed += usize::from(hash.remove(field).is_some());
                }
                if hash.is_empty() {
                    data.store.remove(&key);
                }
            }
            Ok(int(removed))
        }
        Some("PEXPIRE") => Ok(int(usize::from(data.store.contains_key(arg(1)?)))),
        Some("PUBLISH") => {
            data.published.push((arg(1)?.clone(), arg(2)?.clone()));
            Ok(int(0))
        }
        other => Err(mlua::Error::runtime(format!("the model does not serve {other:?}"))),
    }
}
