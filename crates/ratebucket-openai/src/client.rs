//! The OpenAI-compatible client: `complete` and `stream`, paced by requests and tokens.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, header};
use ratebucket_http::{FetchConfig, Fetcher, Transport};
use ratebucket_rt::Limiter;
use ratebucket_rt::core::Rng;

use crate::builder::ClientBuilder;
use crate::error::OpenAiError;
use crate::estimate::{CharsPerToken, TokenEstimator};
use crate::stream::{Beginning, ChunkStream};
use crate::types::{ApiError, ChatCompletion, ChatRequest, StreamOptions};
use crate::vendor::{Limits, MONEY, OpenAiVendor, REQUESTS, TOKENS};
use ratebucket_http::price::{Price, Prices};

/// Where chat completions are posted.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Endpoint {
    /// An OpenAI-style base URL (`https://api.openai.com`, `https://api.openai.com/v1`,
    /// a vLLM or LiteLLM server): posts to `{base}/v1/chat/completions`.
    OpenAi(String),
    /// An Azure OpenAI deployment: posts to
    /// `{resource}/openai/deployments/{deployment}/chat/completions?api-version=...`.
    Azure {
        /// `https://NAME.openai.azure.com`.
        resource: String,
        /// The deployment name.
        deployment: String,
        /// The API version, e.g. `2024-10-21`.
        api_version: String,
    },
    /// A full URL, used as is.
    Url(String),
}

impl Endpoint {
    /// The URL requests go to.
    pub fn url(&self) -> String {
        match self {
            Endpoint::OpenAi(base) => {
                let base = base.trim_end_matches('/');
                if base.ends_with("/v1") {
                    format!("{base}/chat/completions")
                } else {
                    format!("{base}/v1/chat/completions")
                }
            }
            Endpoint::Azure { resource, deployment, api_version } => format!(
                "{}/openai/deployments/{deployment}/chat/completions?api-version={api_version}",
                resource.trim_end_matches('/')
            ),
            Endpoint::Url(url) => url.clone(),
        }
    }
}

impl From<&str> for Endpoint {
    /// An OpenAI-style base URL ([`Endpoint::OpenAi`]).
    fn from(base: &str) -> Endpoint {
        Endpoint::OpenAi(base.to_owned())
    }
}

impl From<String> for Endpoint {
    /// An OpenAI-style base URL ([`Endpoint::OpenAi`]).
    fn from(base: String) -> Endpoint {
        Endpoint::OpenAi(base)
    }
}

/// How requests authenticate.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Auth {
    /// `Authorization: Bearer KEY` (OpenAI, vLLM, LiteLLM...).
    Bearer(String),
    /// `api-key: KEY` (Azure).
    ApiKey(String),
    /// No credentials.
    None,
}

impl fmt::Debug for Auth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print the key.
        f.write_str(match self {
            Auth::Bearer(_) => "Bearer(..)",
            Auth::ApiKey(_) => "ApiKey(..)",
            Auth::None => "None",
        })
    }
}

/// Client settings.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct OpenAiConfig {
    /// Where to post.
    pub endpoint: Endpoint,
    /// Credentials.
    pub auth: Auth,
    /// Headers added to every request (organization, project, proxy headers...).
    pub headers: HeaderMap,
    /// The completion limit reserved when a request sets none.
    pub default_max_tokens: u64,
    /// Commit the reported usage (refunding the over-estimate). Off means every request
    /// stays charged its full estimate, as a client without reconciliation would.
    pub reconcile: bool,
    /// The provider's dialect of rate-limit signals; `None` (the default) recognises one
    /// from each reply where that is unambiguous and reads OpenAI's otherwise
    /// ([`OpenAiVendor::dialect`]).
    pub dialect: Option<&'static ratebucket_http::dialect::Dialect>,
    /// Retries, timeouts and body limits of the underlying fetcher.
    pub fetch: FetchConfig,
    /// The longest a stream may go without a byte once its answer has started; past it the
    /// stream fails with [`OpenAiError::StreamTimedOut`] (ambiguous, charged as reserved).
    /// Two minutes by default; `None` waits forever.
    pub stream_idle_timeout: Option<Duration>,
    /// The longest a whole stream may take, from its first byte; `None` (the default) sets
    /// no limit.
    pub stream_deadline: Option<Duration>,
    /// The largest server-sent event a stream accepts, in bytes (16 MiB by default): past
    /// it the stream fails instead of buffering without bound.
    pub max_event_bytes: usize,
    /// The models' prices, for a limiter with a money dimension ([`MONEY`], a budget; see
    /// [`ClientBuilder::budget`](crate::ClientBuilder::budget)): each call reserves its
    /// highest price and is committed at what its usage cost.
    pub prices: Option<Arc<Prices>>,
}

impl OpenAiConfig {
    /// Settings for `endpoint` with `auth`.
    pub fn new(endpoint: Endpoint, auth: Auth) -> OpenAiConfig {
        OpenAiConfig {
            endpoint,
            auth,
            headers: HeaderMap::new(),
            default_max_tokens: 4096,
            reconcile: true,
            dialect: None,
            fetch: FetchConfig::default(),
            stream_idle_timeout: Some(Duration::from_secs(120)),
            stream_deadline: None,
            max_event_bytes: 16 << 20,
            prices: None,
        }
    }

    /// Sets the stream idle timeout (`None`: wait forever between chunks).
    pub fn stream_idle_timeout(mut self, timeout: Option<Duration>) -> OpenAiConfig {
        self.stream_idle_timeout = timeout;
        self
    }

    /// Sets the whole-stream deadline (`None`: no limit).
    pub fn stream_deadline(mut self, deadline: Option<Duration>) -> OpenAiConfig {
        self.stream_deadline = deadline;
        self
    }

    /// Adds a header to every request.
    pub fn header(mut self, name: http::HeaderName, value: HeaderValue) -> OpenAiConfig {
        self.headers.insert(name, value);
        self
    }

    /// Turns reconciliation against reported usage on or off.
    pub fn reconcile(mut self, on: bool) -> OpenAiConfig {
        self.reconcile = on;
        self
    }

    /// Sets the fetcher settings (retries, timeouts).
    pub fn fetch(mut self, fetch: FetchConfig) -> OpenAiConfig {
        self.fetch = fetch;
        self
    }

    /// Prices calls by `prices`, for a limiter whose dimension [`MONEY`] is a budget.
    pub fn prices(mut self, prices: Prices) -> OpenAiConfig {
        self.prices = Some(Arc::new(prices));
        self
    }

    /// Reads the provider's rate-limit signals in `dialect` (see
    /// [`ClientBuilder::dialect`](crate::ClientBuilder::dialect)).
    pub fn dialect(mut self, dialect: &'static ratebucket_http::dialect::Dialect) -> OpenAiConfig {
        self.dialect = Some(dialect);
        self
    }
}

/// A completed chat completion with what it cost.
#[derive(Clone, Debug, PartialEq)]
pub struct Completion {
    /// The answer.
    pub completion: ChatCompletion,
    /// Attempts it took.
    pub attempts: u32,
    /// Tokens reserved before sending (prompt estimate + completion limit).
    pub reserved_tokens: u64,
}

/// An OpenAI-compatible chat completions client paced by a two-dimension [`Limiter`]
/// (dimension 0 requests, dimension 1 tokens; build it from [`Limits::buckets`]).
///
/// Each call reserves 1 request and `prompt estimate + max_tokens` tokens, waits for the
/// pool-wide gate, sends, and commits the `usage.total_tokens` the server reports. The
/// provider's `x-ratelimit-*` headers lower the buckets (never raise them) and teach the
/// client the real limits. Cheap to clone.
pub struct Client<T> {
    fetcher: Fetcher<T, OpenAiVendor>,
    config: Arc<OpenAiConfig>,
    pub(crate) estimator: Arc<dyn TokenEstimator>,
    /// Whose share its calls count against, and their class.
    caller: ratebucket_rt::core::Caller,
}

impl Client<()> {
    /// Starts building a client posting to `endpoint` (a base URL such as
    /// `https://api.openai.com`, or any [`Endpoint`]), with limits not known until the
    /// first reply's headers tell them ([`Limits::unknown`]) unless [`ClientBuilder::limits`]
    /// says otherwise.
    pub fn builder(endpoint: impl Into<Endpoint>) -> ClientBuilder {
        ClientBuilder::new(endpoint)
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

impl<T: Transport> Client<T> {
    /// A client sending through `transport`, paced by `limiter` (built from `limits`).
    pub fn new(transport: T, limiter: Limiter, limits: Limits, config: OpenAiConfig) -> Client<T> {
        let vendor = OpenAiVendor::new(limits)
            .reconcile(config.reconcile)
            .dialect(config.dialect)
            .prices(config.prices.clone());
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

    /// Uses another prompt token estimator (e.g. `Tiktoken` with the `tiktoken` feature).
    pub fn with_estimator(mut self, estimator: impl TokenEstimator) -> Client<T> {
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

    /// Whether `dimension` runs at the provider's full capacity, because its headers show a
    /// continuously refilling bucket (see [`Burst`](crate::Burst)).
    pub fn uses_provider_burst(&self, dimension: usize) -> bool {
        self.limiter()
            .dimension(dimension)
            .and_then(|v| v.state.learned)
            .is_some_and(|l| l.provider_burst)
    }

    /// Tokens a request reserves: its prompt estimate plus its completion limit for each
    /// of its `n` choices ([`ChatRequest::token_bound`]).
    pub fn estimate(&self, request: &ChatRequest) -> u64 {
        let prompt = self.estimator.prompt_tokens(request);
        request.token_bound(prompt, self.config.default_max_tokens)
    }

    /// Sends a chat completion and waits for the whole answer.
    pub async fn complete(&self, mut request: ChatRequest) -> Result<Completion, OpenAiError> {
        request.stream = None;
        request.stream_options = None;
        let target = self.target()?;
        let (cost, _) = self.cost(&request)?;
        let body = self.encode(&request)?;
        let fetched = self.fetcher.fetch_costed(&cost, |_| self.build(&target, &body)).await?;
        let completion = decode_completion(fetched.response.body())?;
        Ok(Completion { completion, attempts: fetched.attempts, reserved_tokens: cost[TOKENS] })
    }

    /// Sends a streaming chat completion (with `stream_options.include_usage`) and returns
    /// its chunks once the first content has arrived (or the stream ended or failed
    /// without any). Errors before the stream starts are retried as for
    /// [`Client::complete`]. Before the first content:
    /// - an error chunk that says the provider is rate-limited or overloaded is a
    ///   throttle: the pool pauses once, as for a 429, and the request is sent again;
    /// - a stream cut or silent before its first event delivered nothing but may have been
    ///   counted: like any ambiguous failure it stays charged, and it is sent again only
    ///   when the retry policy's `retry_ambiguous` is set (after a jittered backoff).
    ///
    /// Either is sent again within `max_retries` and the policy's deadline. Once content
    /// has arrived nothing is re-sent: a later error is ambiguous.
    pub async fn stream(&self, mut request: ChatRequest) -> Result<ChunkStream, OpenAiError> {
        request.stream = Some(true);
        request.stream_options = Some(StreamOptions { include_usage: true });
        let target = self.target()?;
        let (cost, price) = self.cost(&request)?;
        let body = self.encode(&request)?;
        let policy = self.config.fetch.retry;
        let mut rng = Rng::with_seed(self.config.fetch.seed);
        let mut earlier_attempts = 0;
        let mut resent = 0;
        loop {
            let opened = self.fetcher.open(&cost, |_| self.build(&target, &body)).await?;
            if let Some(kind) = ratebucket_http::not_an_event_stream(opened.response.headers()) {
                // Taken, and probably billed: charged as reserved, never re-sent.
                opened.reservation.keep();
                return Err(OpenAiError::NotAStream(kind));
            }
            let reader = ratebucket_http::EventReader::new(
                opened.response.into_body(),
                self.limiter().clone(),
                ratebucket_http::StreamLimits {
                    idle: self.config.stream_idle_timeout,
                    deadline: self.config.stream_deadline,
                    max_event_bytes: self.config.max_event_bytes,
                },
            );
            let mut stream = ChunkStream::new(
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
                    tracing::debug!(target: "ratebucket", resent, "rate-limited before the first content; the pool pauses and the request goes again");
                    earlier_attempts = stream.attempts();
                    stream.throttle();
                    resent += 1;
                }
                Beginning::Silent if again && policy.retry_ambiguous => {
                    tracing::debug!(target: "ratebucket", resent, "stream failed before its first event; sending again");
                    earlier_attempts = stream.attempts();
                    drop(stream);
                    self.limiter().sleep(policy.backoff(resent, &mut rng)).await;
                    resent += 1;
                }
                _ => return Ok(stream),
            }
        }
    }

    /// 1 request and the token estimate, capped at the token bucket's capacity (a request
    /// larger than the burst still goes when the bucket is full; the excess is debt); with
    /// prices, the call's highest price as well, and that price.
    fn cost(&self, request: &ChatRequest) -> Result<(Vec<u64>, Option<Price>), OpenAiError> {
        let prompt = self.estimator.prompt_tokens(request);
        let tokens = request.token_bound(prompt, self.config.default_max_tokens);
        let mut cost = call_cost(tokens, self.limiter());
        let Some(prices) = &self.config.prices else {
            return Ok((cost, None));
        };
        let price = prices.price(&request.model).ok_or_else(|| {
            OpenAiError::Config(format!(
                "the budget's price table has no price for model `{}`",
                request.model
            ))
        })?;
        cost.push(price.most(prompt, tokens.saturating_sub(prompt)));
        Ok((cost, Some(price)))
    }

    fn encode(&self, request: &ChatRequest) -> Result<Bytes, OpenAiError> {
        serde_json::to_vec(request)
            .map(Bytes::from)
            .map_err(|e| OpenAiError::Request(e.to_string()))
    }

    /// Where requests go and how they are signed, checked before anything is reserved or
    /// sent: a URL that does not parse or lacks a scheme and host, or a key that cannot be
    /// a header value (a newline, say), is a configuration error, not a network failure.
    /// Refuses now what `complete` and `stream` would refuse: a bad endpoint or key.
    pub(crate) fn check(&self) -> Result<(), OpenAiError> {
        self.target().map(drop)
    }

    fn target(&self) -> Result<Target, OpenAiError> {
        let url = self.config.endpoint.url();
        let uri: http::Uri = url
            .parse()
            .map_err(|e| OpenAiError::Config(format!("endpoint `{url}` is not a URL: {e}")))?;
        match uri.scheme_str() {
            Some("http" | "https") if uri.authority().is_some() => {}
            _ => {
                return Err(OpenAiError::Config(format!(
                    "endpoint `{url}` needs an http:// or https:// scheme and a host"
                )));
            }
        }
        let key_error = |what: &str| {
            OpenAiError::Config(format!(
                "the API key cannot be sent as {what}: it holds a control character (a newline?)"
            ))
        };
        let auth = match &self.config.auth {
            Auth::Bearer(key) => Some((
                header::AUTHORIZATION,
                HeaderValue::from_str(&format!("Bearer {key}"))
                    .map_err(|_| key_error("an Authorization header"))?,
            )),
            Auth::ApiKey(key) => Some((
                http::HeaderName::from_static("api-key"),
                HeaderValue::from_str(key).map_err(|_| key_error("an api-key header"))?,
            )),
            Auth::None => None,
        };
        Ok(Target { uri, auth })
    }

    fn build(&self, target: &Target, body: &Bytes) -> Request<Bytes> {
        let mut request = Request::new(body.clone());
        *request.method_mut() = http::Method::POST;
        *request.uri_mut() = target.uri.clone();
        let headers = request.headers_mut();
        headers.clone_from(&self.config.headers);
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let Some((name, value)) = &target.auth {
            let mut value = value.clone();
            value.set_sensitive(true);
            headers.insert(name.clone(), value);
        }
        if self.caller != ratebucket_rt::core::Caller::default() {
            request.extensions_mut().insert(self.caller);
        }
        request
    }
}

/// What one chat completion reserves: 1 request and `tokens` (its estimate), the tokens
/// capped at the token bucket's capacity (a request larger than the burst still goes when
/// the bucket is full; the excess is debt).
pub fn call_cost(tokens: u64, limiter: &Limiter) -> Vec<u64> {
    let capacity = limiter.dimension(TOKENS).map(|v| v.state.capacity).unwrap_or(u64::MAX);
    let mut cost = vec![0; 2];
    cost[REQUESTS] = 1;
    cost[TOKENS] = tokens.min(capacity);
    cost
}

/// What a completion's body says it used, as a charge for a call that reserved `reserved`:
/// the reservation with its tokens replaced by the reported `usage.total_tokens`; `None`
/// when the body reports no usage.
pub fn usage_charge(reserved: &[u64], body: &[u8]) -> Option<Vec<u64>> {
    priced_charge(reserved, body, None)
}

/// [`usage_charge`], and for a reservation with a money dimension ([`MONEY`]), what the
/// usage cost at the price `prices` gives the answer's model (kept as reserved when the
/// table does not price it).
pub(crate) fn priced_charge(
    reserved: &[u64],
    body: &[u8],
    prices: Option<&Prices>,
) -> Option<Vec<u64>> {
    /// Only the usage and the model: the choices are skipped, not decoded.
    #[derive(serde::Deserialize)]
    struct Reported {
        usage: Option<crate::Usage>,
        #[serde(default)]
        model: String,
    }
    let reported = serde_json::from_slice::<Reported>(body).ok()?;
    let usage = reported.usage?;
    let mut actual = reserved.to_vec();
    *actual.get_mut(TOKENS)? = usage.total();
    if let (Some(money), Some(price)) =
        (actual.get_mut(MONEY), prices.and_then(|p| p.price(&reported.model)))
    {
        *money = price.of(&usage);
    }
    Some(actual)
}

/// A checked destination: the URI and the signed credentials header.
struct Target {
    uri: http::Uri,
    auth: Option<(http::HeaderName, HeaderValue)>,
}

/// A 2xx body that must be a chat completion: an `error` object (some proxies answer 200
/// with one) or a body without `choices` is not one.
fn decode_completion(body: &[u8]) -> Result<ChatCompletion, OpenAiError> {
    let value: serde_json::Value = serde_json::from_slice(body).map_err(OpenAiError::Decode)?;
    if let Some(error) = value.get("error").filter(|e| !e.is_null()) {
        let error = serde_json::from_value::<ApiError>(error.clone()).unwrap_or_default();
        return Err(OpenAiError::NotACompletion(Some(error)));
    }
    if !value.get("choices").is_some_and(serde_json::Value::is_array) {
        return Err(OpenAiError::NotACompletion(None));
    }
    serde_json::from_value(value).map_err(OpenAiError::Decode)
}

impl<T> fmt::Debug for Client<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client").field("config", &self.config).finish_non_exhaustive()
    }
}
