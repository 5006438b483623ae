//! The Messages API client: `complete` and `stream`, paced by requests, input tokens and
//! output tokens at once.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Request, header};
use ratebucket_http::{EventReader, FetchConfig, Fetcher, StreamLimits, Transport};
use ratebucket_rt::Limiter;
use ratebucket_rt::core::Rng;

use crate::builder::ClientBuilder;
use crate::error::AnthropicError;
use crate::estimate::{CharsPerToken, InputEstimator};
use crate::stream::{Beginning, MessageStream};
use crate::types::{ApiError, MessagesRequest, MessagesResponse};
use crate::vendor::{AnthropicVendor, INPUT_TOKENS, Limits, OUTPUT_TOKENS, REQUESTS, TOKENS};

/// The API version sent unless the configuration says another.
pub const API_VERSION: &str = "2023-06-01";

/// Client settings.
#[derive(Clone)]
#[non_exhaustive]
pub struct AnthropicConfig {
    /// The base URL (`https://api.anthropic.com`): messages go to `{base}/v1/messages`.
    pub base_url: String,
    /// The API key, sent as `x-api-key` (none for a server that asks for none).
    pub api_key: Option<String>,
    /// The `anthropic-version` header.
    pub version: String,
    /// Headers added to every request (`anthropic-beta`, proxy headers...).
    pub headers: HeaderMap,
    /// Settle at the reported usage (refunding the over-estimate). Off: every request
    /// stays charged as reserved.
    pub reconcile: bool,
    /// Retries, timeouts and body limits of the underlying fetcher.
    pub fetch: FetchConfig,
    /// The longest a stream may go without a byte once its answer has started (two
    /// minutes by default; `None` waits forever).
    pub stream_idle_timeout: Option<Duration>,
    /// The longest a whole stream may take, from its first byte (`None`, the default:
    /// no limit).
    pub stream_deadline: Option<Duration>,
    /// The largest server-sent event a stream accepts, in bytes (16 MiB by default).
    pub max_event_bytes: usize,
    /// The models' prices, for a limiter with a money dimension ([`MONEY`](crate::MONEY),
    /// a budget; see [`ClientBuilder::budget`](crate::ClientBuilder::budget)): each call
    /// reserves its highest price and is committed at what its usage cost.
    pub prices: Option<Arc<ratebucket_http::price::Prices>>,
}

impl AnthropicConfig {
    /// Settings for the server at `base_url`.
    pub fn new(base_url: impl Into<String>) -> AnthropicConfig {
        AnthropicConfig {
            base_url: base_url.into(),
            api_key: None,
            version: API_VERSION.to_owned(),
            headers: HeaderMap::new(),
            reconcile: true,
            fetch: FetchConfig::default(),
            stream_idle_timeout: Some(Duration::from_secs(120)),
            stream_deadline: None,
            max_event_bytes: 16 << 20,
            prices: None,
        }
    }

    /// Prices calls by `prices`, for a limiter whose dimension [`MONEY`](crate::MONEY) is
    /// a budget.
    pub fn prices(mut self, prices: ratebucket_http::price::Prices) -> AnthropicConfig {
        self.prices = Some(Arc::new(prices));
        self
    }

    /// Sets the API key.
    pub fn api_key(mut self, key: impl Into<String>) -> AnthropicConfig {
        self.api_key = Some(key.into());
        self
    }

    /// Adds a header to every request.
    pub fn header(mut self, name: HeaderName, value: HeaderValue) -> AnthropicConfig {
        self.headers.insert(name, value);
        self
    }

    /// Sets the fetcher settings (retries, timeouts).
    pub fn fetch(mut self, fetch: FetchConfig) -> AnthropicConfig {
        self.fetch = fetch;
        self
    }

    /// Turns settlement at the reported usage on or off.
    pub fn reconcile(mut self, on: bool) -> AnthropicConfig {
        self.reconcile = on;
        self
    }

    /// Sets the stream idle timeout (`None`: wait forever between events).
    pub fn stream_idle_timeout(mut self, timeout: Option<Duration>) -> AnthropicConfig {
        self.stream_idle_timeout = timeout;
        self
    }
}

impl fmt::Debug for AnthropicConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print the key.
        f.debug_struct("AnthropicConfig")
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| ".."))
            .field("version", &self.version)
            .field("reconcile", &self.reconcile)
            .field("fetch", &self.fetch)
            .finish_non_exhaustive()
    }
}

/// A whole message with what it took.
#[derive(Clone, Debug, PartialEq)]
pub struct Completion {
    /// The answer.
    pub message: MessagesResponse,
    /// Attempts it took.
    pub attempts: u32,
    /// What was reserved: requests, input tokens, output tokens (and micro-dollars, with a
    /// budget).
    pub reserved: Vec<u64>,
}

/// A Messages API client paced by a three-dimension [`Limiter`] (requests, input tokens,
/// output tokens; build it from [`Limits::per_dimension`], or let
/// [`Client::builder`] make it).
///
/// Each call reserves one request, its input estimate and its `max_tokens`, waits for the
/// pool-wide gate, sends, and settles at the usage the provider reports (input tokens
/// counted as the limit counts them, without cache reads). The provider's
/// `anthropic-ratelimit-*` headers lower the buckets and teach the client the real limits.
/// Cheap to clone.
pub struct Client<T> {
    fetcher: Fetcher<T, AnthropicVendor>,
    config: Arc<AnthropicConfig>,
    pub(crate) estimator: Arc<dyn InputEstimator>,
    /// Whose share its calls count against, and their class.
    caller: ratebucket_rt::core::Caller,
}

impl Client<()> {
    /// Starts building a client for the server at `base_url`
    /// (`https://api.anthropic.com`), its limits unknown until the first reply's headers
    /// tell them unless [`ClientBuilder::limits`] says otherwise.
    pub fn builder(base_url: impl Into<String>) -> ClientBuilder {
        ClientBuilder::new(base_url)
    }
}

impl<T> Clone for Client<T> {
    fn clone(&self) -> Self {
        Client {
            fetcher: self.fetcher.clone(),
            config: Arc::clone(&self.config),
            estimator: Arc::clone(&self.estimator),
            caller: self.caller,
        }
    }
}

impl<T> fmt::Debug for Client<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client").field("config", &self.config).finish_non_exhaustive()
    }
}

impl<T: Transport> Client<T> {
    /// A client sending through `transport`, paced by `limiter` (built from `limits`).
    pub fn new(
        transport: T,
        limiter: Limiter,
        limits: Limits,
        config: AnthropicConfig,
    ) -> Client<T> {
        let vendor =
            AnthropicVendor::new(limits).reconcile(config.reconcile).prices(config.prices.clone());
        let fetcher = Fetcher::with_vendor(transport, limiter, config.fetch.clone(), vendor);
        Client {
            fetcher,
            config: Arc::new(config),
            estimator: Arc::new(CharsPerToken),
            caller: ratebucket_rt::core::Caller::default(),
        }
    }

    /// This client for `caller`: its calls count against that tenant's share of the pool
    /// (a weight set with [`Limiter::set_weight`]) and queue in that priority class,
    /// ahead of lower classes until they have aged. The limiter, transport and learned
    /// limits stay shared with the client it came from: for example
    /// `client.for_caller(Caller::tenant(7).priority(Priority::Interactive))`.
    pub fn for_caller(&self, caller: ratebucket_rt::core::Caller) -> Client<T> {
        let mut client = self.clone();
        client.caller = caller;
        client
    }

    /// Uses another input token estimator.
    pub fn with_estimator(mut self, estimator: impl InputEstimator) -> Client<T> {
        self.estimator = Arc::new(estimator);
        self
    }

    /// The limiter.
    pub fn limiter(&self) -> &Limiter {
        self.fetcher.limiter()
    }

    /// The per-minute limits in force: configured, lowered or adopted from headers.
    pub fn limits(&self) -> Limits {
        self.fetcher.vendor().limits(self.limiter())
    }

    /// What a request reserves: one request, its input estimate, its `max_tokens`, and both
    /// together (a combined limit, [`TOKENS`]), each capped at its bucket's capacity (a
    /// request larger than the burst still goes when the bucket is full; the excess is
    /// owed).
    pub fn cost(&self, request: &MessagesRequest) -> Vec<u64> {
        let capped = |dimension: usize, amount: u64| {
            let capacity =
                self.limiter().dimension(dimension).map_or(u64::MAX, |v| v.state.capacity);
            amount.min(capacity)
        };
        let input = self.estimator.input_tokens(request);
        let mut cost = vec![0; 4];
        cost[REQUESTS] = 1;
        cost[INPUT_TOKENS] = capped(INPUT_TOKENS, input);
        cost[OUTPUT_TOKENS] = capped(OUTPUT_TOKENS, request.max_tokens);
        cost[TOKENS] = capped(TOKENS, input.saturating_add(request.max_tokens));
        cost
    }

    /// [`Client::cost`], and with prices, the call's highest price (every input token at
    /// the input price, `max_tokens` at the output price) as well, and that price.
    fn priced_cost(
        &self,
        request: &MessagesRequest,
    ) -> Result<(Vec<u64>, Option<ratebucket_http::price::Price>), AnthropicError> {
        let mut cost = self.cost(request);
        let Some(prices) = &self.config.prices else {
            return Ok((cost, None));
        };
        let price = prices.price(&request.model).ok_or_else(|| {
            AnthropicError::Config(format!(
                "the budget's price table has no price for model `{}`",
                request.model
            ))
        })?;
        let input = self.estimator.input_tokens(request);
        cost.push(price.most(input, request.max_tokens));
        Ok((cost, Some(price)))
    }

    /// Sends a message and waits for the whole answer.
    pub async fn complete(
        &self,
        mut request: MessagesRequest,
    ) -> Result<Completion, AnthropicError> {
        request.stream = None;
        let target = self.target()?;
        let (cost, _) = self.priced_cost(&request)?;
        let body = encode(&request)?;
        let fetched = self.fetcher.fetch_costed(&cost, |_| self.build(&target, &body)).await?;
        let message = decode(fetched.response.body())?;
        Ok(Completion { message, attempts: fetched.attempts, reserved: cost })
    }

    /// Sends a streamed message and returns its events once the first content delta has
    /// arrived (or the stream ended or failed without any). Errors before the stream starts
    /// are retried as for [`Client::complete`]. Before the first delta:
    /// - a `rate_limit_error` or `overloaded_error` event is a throttle: the pool pauses
    ///   once, as for a 429, and the request is sent again;
    /// - a stream cut or silent before any event is ambiguous: sent again only when the
    ///   retry policy's `retry_ambiguous` is set.
    ///
    /// Either goes again within `max_retries` and the policy's deadline. After the first
    /// delta nothing is re-sent: a later error is ambiguous and stays charged.
    pub async fn stream(
        &self,
        mut request: MessagesRequest,
    ) -> Result<MessageStream, AnthropicError> {
        request.stream = Some(true);
        let target = self.target()?;
        let (cost, price) = self.priced_cost(&request)?;
        let body = encode(&request)?;
        let policy = self.config.fetch.retry;
        let mut rng = Rng::with_seed(self.config.fetch.seed);
        let (mut earlier_attempts, mut resent) = (0, 0);
        loop {
            let opened = self.fetcher.open(&cost, |_| self.build(&target, &body)).await?;
            if let Some(kind) = ratebucket_http::not_an_event_stream(opened.response.headers()) {
                opened.reservation.keep();
                return Err(AnthropicError::NotAStream(kind));
            }
            let reader = EventReader::new(
                opened.response.into_body(),
                self.limiter().clone(),
                StreamLimits {
                    idle: self.config.stream_idle_timeout,
                    deadline: self.config.stream_deadline,
                    max_event_bytes: self.config.max_event_bytes,
                },
            );
            let mut stream = MessageStream::new(
                opened.span,
                reader,
                opened.reservation,
                opened.sent,
                (cost.clone(), price),
                self.config.reconcile,
                opened.attempts,
            );
            stream.add_attempts(earlier_attempts);
            let beginning = stream.begin().await;
            let in_time = policy.deadline.is_none_or(|d| self.limiter().now() < d);
            let again = resent < policy.max_retries && in_time;
            match beginning {
                Beginning::Throttled if again => {
                    tracing::debug!(target: "ratebucket", resent, "throttled before the first delta; the pool pauses and the request goes again");
                    earlier_attempts = stream.attempts();
                    stream.throttle();
                    resent += 1;
                }
                Beginning::Silent if again && policy.retry_ambiguous => {
                    earlier_attempts = stream.attempts();
                    drop(stream);
                    self.limiter().sleep(policy.backoff(resent, &mut rng)).await;
                    resent += 1;
                }
                _ => return Ok(stream),
            }
        }
    }

    /// Refuses now what `complete` and `stream` would refuse: a bad URL, key or header.
    pub(crate) fn check(&self) -> Result<(), AnthropicError> {
        self.target().map(drop)
    }

    fn target(&self) -> Result<Target, AnthropicError> {
        let base = self.config.base_url.trim_end_matches('/');
        let url = if base.ends_with("/v1") {
            format!("{base}/messages")
        } else {
            format!("{base}/v1/messages")
        };
        let uri: http::Uri = url
            .parse()
            .map_err(|e| AnthropicError::Config(format!("`{url}` is not a URL: {e}")))?;
        if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.authority().is_none() {
            return Err(AnthropicError::Config(format!(
                "`{url}` needs an http:// or https:// scheme and a host"
            )));
        }
        let mut headers = self.config.headers.clone();
        let version = HeaderValue::from_str(&self.config.version).map_err(|_| {
            AnthropicError::Config("the anthropic-version is not a header value".into())
        })?;
        headers.insert(HeaderName::from_static("anthropic-version"), version);
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let Some(key) = &self.config.api_key {
            let mut key = HeaderValue::from_str(key).map_err(|_| {
                AnthropicError::Config(
                    "the API key cannot be sent as x-api-key: it holds a control character (a newline?)"
                        .into(),
                )
            })?;
            key.set_sensitive(true);
            headers.insert(HeaderName::from_static("x-api-key"), key);
        }
        Ok(Target { uri, headers })
    }

    fn build(&self, target: &Target, body: &Bytes) -> Request<Bytes> {
        let mut request = Request::new(body.clone());
        *request.method_mut() = http::Method::POST;
        *request.uri_mut() = target.uri.clone();
        *request.headers_mut() = target.headers.clone();
        if self.caller != ratebucket_rt::core::Caller::default() {
            request.extensions_mut().insert(self.caller);
        }
        request
    }
}

/// A checked destination: the URI and the headers every request carries.
struct Target {
    uri: http::Uri,
    headers: HeaderMap,
}

fn encode(request: &MessagesRequest) -> Result<Bytes, AnthropicError> {
    serde_json::to_vec(request).map(Bytes::from).map_err(|e| AnthropicError::Request(e.to_string()))
}

/// A 2xx body that must be a message: an error object is not one.
fn decode(body: &[u8]) -> Result<MessagesResponse, AnthropicError> {
    let value: serde_json::Value = serde_json::from_slice(body).map_err(AnthropicError::Decode)?;
    if value.get("type").and_then(serde_json::Value::as_str) == Some("error") {
        let error = value
            .get("error")
            .and_then(|e| serde_json::from_value::<ApiError>(e.clone()).ok())
            .unwrap_or_default();
        return Err(AnthropicError::NotAMessage(error));
    }
    serde_json::from_value(value).map_err(AnthropicError::Decode)
}
