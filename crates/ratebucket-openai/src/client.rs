//! The OpenAI-compatible client: `complete` and `stream`, paced by requests and tokens.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, header};
use ratebucket_http::{FetchConfig, Fetcher, Transport};
use ratebucket_rt::Limiter;
use ratebucket_rt::core::Rng;

use crate::error::OpenAiError;
use crate::estimate::{CharsPerToken, TokenEstimator};
use crate::stream::{ChunkStream, Timeouts};
use crate::types::{ApiError, ChatCompletion, ChatRequest, StreamOptions};
use crate::vendor::{Limits, OpenAiVendor, REQUESTS, TOKENS};

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
            Endpoint::Azure {
                resource,
                deployment,
                api_version,
            } => format!(
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
            fetch: FetchConfig::default(),
            stream_idle_timeout: Some(Duration::from_secs(120)),
            stream_deadline: None,
            max_event_bytes: 16 << 20,
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
    estimator: Arc<dyn TokenEstimator>,
}

impl<T> Clone for Client<T> {
    fn clone(&self) -> Self {
        Client {
            fetcher: self.fetcher.clone(),
            config: Arc::clone(&self.config),
            estimator: Arc::clone(&self.estimator),
        }
    }
}

impl<T: Transport> Client<T> {
    /// A client sending through `transport`, paced by `limiter` (built from `limits`).
    pub fn new(transport: T, limiter: Limiter, limits: Limits, config: OpenAiConfig) -> Client<T> {
        let vendor = OpenAiVendor::new(limits).reconcile(config.reconcile);
        let fetcher = Fetcher::with_vendor(transport, limiter, config.fetch.clone(), vendor);
        Client {
            fetcher,
            config: Arc::new(config),
            estimator: Arc::new(CharsPerToken),
        }
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
        let cost = self.cost(&request);
        let body = self.encode(&request)?;
        let fetched = self
            .fetcher
            .fetch_costed(&cost, |_| self.build(&target, &body))
            .await?;
        let completion = decode_completion(fetched.response.body())?;
        Ok(Completion {
            completion,
            attempts: fetched.attempts,
            reserved_tokens: cost[TOKENS],
        })
    }

    /// Sends a streaming chat completion (with `stream_options.include_usage`) and returns
    /// its chunks once the first event has arrived. Errors before the stream starts are
    /// retried as for [`Client::complete`]. A stream that is cut or goes silent before its
    /// first event delivered nothing but may have been counted: like any ambiguous failure
    /// it stays charged, and it is sent again only when the retry policy's
    /// `retry_ambiguous` is set (within `max_retries`, after a jittered backoff). Once an
    /// event has arrived nothing is re-sent.
    pub async fn stream(&self, mut request: ChatRequest) -> Result<ChunkStream, OpenAiError> {
        request.stream = Some(true);
        request.stream_options = Some(StreamOptions {
            include_usage: true,
        });
        let target = self.target()?;
        let cost = self.cost(&request);
        let body = self.encode(&request)?;
        let policy = self.config.fetch.retry;
        let mut rng = Rng::with_seed(self.config.fetch.seed);
        let mut earlier_attempts = 0;
        let mut resent = 0;
        loop {
            let opened = self
                .fetcher
                .open(&cost, |_| self.build(&target, &body))
                .await?;
            if let Some(kind) = not_an_event_stream(opened.response.headers()) {
                // Taken, and probably billed: charged as reserved, never re-sent.
                opened.reservation.keep();
                return Err(OpenAiError::NotAStream(kind));
            }
            let mut stream = ChunkStream::new(
                opened.span,
                opened.response.into_body(),
                opened.reservation,
                cost.clone(),
                self.config.reconcile,
                opened.attempts,
                Timeouts {
                    limiter: self.limiter().clone(),
                    idle: self.config.stream_idle_timeout,
                    deadline: self.config.stream_deadline,
                    max_event_bytes: self.config.max_event_bytes,
                },
            );
            stream.add_attempts(earlier_attempts);
            let first = futures_lite::StreamExt::next(&mut stream).await;
            let silent = matches!(
                first,
                Some(Err(
                    OpenAiError::StreamCut | OpenAiError::StreamTimedOut { idle: true }
                ))
            );
            let in_time = policy.deadline.is_none_or(|d| self.limiter().now() < d);
            if silent
                && stream.failed_before_content()
                && policy.retry_ambiguous
                && resent < policy.max_retries
                && in_time
            {
                tracing::debug!(target: "ratebucket", resent, "stream failed before its first event; sending again");
                earlier_attempts = stream.attempts();
                drop(stream);
                self.limiter().sleep(policy.backoff(resent, &mut rng)).await;
                resent += 1;
                continue;
            }
            stream.unread(first);
            return Ok(stream);
        }
    }

    /// 1 request and the token estimate, capped at the token bucket's capacity (a request
    /// larger than the burst still goes when the bucket is full; the excess is debt).
    fn cost(&self, request: &ChatRequest) -> Vec<u64> {
        call_cost(self.estimate(request), self.limiter())
    }

    fn encode(&self, request: &ChatRequest) -> Result<Bytes, OpenAiError> {
        serde_json::to_vec(request)
            .map(Bytes::from)
            .map_err(|e| OpenAiError::Request(e.to_string()))
    }

    /// Where requests go and how they are signed, checked before anything is reserved or
    /// sent: a URL that does not parse or lacks a scheme and host, or a key that cannot be
    /// a header value (a newline, say), is a configuration error, not a network failure.
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
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if let Some((name, value)) = &target.auth {
            let mut value = value.clone();
            value.set_sensitive(true);
            headers.insert(name.clone(), value);
        }
        request
    }
}

/// Builds a [`Client`] and, unless given a shared one, its limiter: the limits are stated
/// once, and no clock appears.
///
/// ```no_run
/// # #[tokio::main] async fn main() -> Result<(), ratebucket_openai::OpenAiError> {
/// use ratebucket_openai::{Client, Limits};
///
/// let client = Client::builder("https://api.openai.com")
///     .api_key("sk-...")
///     .limits(Limits::per_minute(500, 200_000))
///     .build()?;
/// # let _ = client; Ok(()) }
/// ```
#[must_use = "a builder does nothing until built"]
pub struct ClientBuilder {
    config: OpenAiConfig,
    key: Option<String>,
    limits: Limits,
    limiter: Option<Limiter>,
    arbiter: ratebucket_rt::core::ArbiterConfig,
    estimator: Arc<dyn TokenEstimator>,
    name: Option<Arc<str>>,
    /// Extra roots to trust beside the default ones, as PEM bytes or a file.
    #[cfg(feature = "tls")]
    extra_roots: Option<ExtraRoots>,
}

/// Roots a builder adds to the defaults ([`ClientBuilder::trust_pem`],
/// [`ClientBuilder::trust_pem_file`]).
#[cfg(feature = "tls")]
#[derive(Clone, Debug)]
enum ExtraRoots {
    Pem(Vec<u8>),
    File(std::path::PathBuf),
}

#[cfg(feature = "tls")]
impl ExtraRoots {
    /// The TLS settings: the default roots and these.
    fn config(&self) -> Result<ratebucket_http::tls::rustls::ClientConfig, OpenAiError> {
        let config = match self {
            ExtraRoots::Pem(pem) => ratebucket_http::tls::adding_pem(pem),
            ExtraRoots::File(path) => ratebucket_http::tls::adding_pem_file(path),
        };
        config.map_err(|e| OpenAiError::Config(e.to_string()))
    }
}

/// How long a built-in transport tries to connect.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

impl fmt::Debug for ClientBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientBuilder")
            .field("config", &self.config)
            .field("limits", &self.limits)
            .field("shared_limiter", &self.limiter.is_some())
            .finish_non_exhaustive()
    }
}

impl Client<()> {
    /// Starts building a client posting to `endpoint` (a base URL such as
    /// `https://api.openai.com`, or any [`Endpoint`]), with limits not known until the
    /// first reply's headers tell them ([`Limits::unknown`]) unless [`ClientBuilder::limits`]
    /// says otherwise.
    pub fn builder(endpoint: impl Into<Endpoint>) -> ClientBuilder {
        ClientBuilder {
            config: OpenAiConfig::new(endpoint.into(), Auth::None),
            key: None,
            limits: Limits::unknown(),
            limiter: None,
            arbiter: arbiter_config(),
            estimator: Arc::new(CharsPerToken),
            name: None,
            #[cfg(feature = "tls")]
            extra_roots: None,
        }
    }
}

impl ClientBuilder {
    /// The API key: sent as `Authorization: Bearer` (OpenAI and compatible servers), or as
    /// `api-key` for an [`Endpoint::Azure`] endpoint.
    pub fn api_key(mut self, key: impl Into<String>) -> ClientBuilder {
        self.key = Some(key.into());
        self
    }

    /// Explicit credentials (instead of [`ClientBuilder::api_key`]).
    pub fn auth(mut self, auth: Auth) -> ClientBuilder {
        self.key = None;
        self.config.auth = auth;
        self
    }

    /// Names the limiter the builder makes (`"openai/gpt-4o-mini"`; `"openai"` unless
    /// named), for spans, metrics and snapshots. A shared limiter keeps its own name.
    pub fn name(mut self, name: impl Into<Arc<str>>) -> ClientBuilder {
        self.name = Some(name.into());
        self
    }

    /// The provider's limits (per minute unless [`Limits::window`] says otherwise).
    pub fn limits(mut self, limits: Limits) -> ClientBuilder {
        self.limits = limits;
        self
    }

    /// Paces with a limiter shared with other clients (made from the same [`Limits`] with
    /// [`Limits::per_dimension`]) instead of one of its own. [`ClientBuilder::build`]
    /// checks that it enforces these limits.
    pub fn limiter(mut self, limiter: Limiter) -> ClientBuilder {
        self.limiter = Some(limiter);
        self
    }

    /// Settings of the limiter it makes (the gate's pauses, backfilling). By default the
    /// first request goes alone
    /// ([`first_alone`](ratebucket_rt::core::ArbiterConfig::first_alone)): its reply's
    /// headers say what the provider books per request before the rest leave.
    pub fn arbiter(mut self, config: ratebucket_rt::core::ArbiterConfig) -> ClientBuilder {
        self.arbiter = config;
        self
    }

    /// Changes the rest of the settings (timeouts, retries, headers).
    pub fn configure(mut self, f: impl FnOnce(OpenAiConfig) -> OpenAiConfig) -> ClientBuilder {
        self.config = f(self.config);
        self
    }

    /// Trusts the certificates in `pem` (a private CA: a self-hosted server, a company's
    /// TLS proxy) beside the default roots, for the transport [`ClientBuilder::build`] or
    /// `ClientBuilder::build_smol` makes. A PEM that holds no certificate is refused
    /// when the client is built.
    #[cfg(feature = "tls")]
    pub fn trust_pem(mut self, pem: impl Into<Vec<u8>>) -> ClientBuilder {
        self.extra_roots = Some(ExtraRoots::Pem(pem.into()));
        self
    }

    /// [`ClientBuilder::trust_pem`] with the PEM file at `path`, read when the client is
    /// built.
    #[cfg(feature = "tls")]
    pub fn trust_pem_file(mut self, path: impl Into<std::path::PathBuf>) -> ClientBuilder {
        self.extra_roots = Some(ExtraRoots::File(path.into()));
        self
    }

    /// Uses another prompt token estimator.
    pub fn estimator(mut self, estimator: impl TokenEstimator) -> ClientBuilder {
        self.estimator = Arc::new(estimator);
        self
    }

    /// Builds a client on tokio, sending through
    /// [`HyperTransport`](ratebucket_http::HyperTransport) (HTTPS with the `tls` feature).
    /// Call it inside a tokio runtime.
    #[cfg(feature = "tokio")]
    pub fn build(mut self) -> Result<Client<ratebucket_http::HyperTransport>, OpenAiError> {
        let limiter = self.limiter_or(|limits, arbiter| {
            Limiter::from_limits(limits, arbiter, ratebucket_tokio::TokioTimer::current())
        })?;
        #[cfg(feature = "tls")]
        if let Some(roots) = &self.extra_roots {
            let transport =
                ratebucket_http::HyperTransport::with_tls(CONNECT_TIMEOUT, roots.config()?);
            return self.finish(transport, limiter);
        }
        self.finish(
            ratebucket_http::HyperTransport::new(CONNECT_TIMEOUT),
            limiter,
        )
    }

    /// Builds a client on smol, sending through
    /// [`SmolTransport`](ratebucket_http::SmolTransport) (HTTPS with the `tls` feature).
    #[cfg(feature = "smol")]
    pub fn build_smol(mut self) -> Result<Client<ratebucket_http::SmolTransport>, OpenAiError> {
        let limiter = self.limiter_or(|limits, arbiter| {
            Limiter::from_limits(limits, arbiter, ratebucket_smol::SmolTimer)
        })?;
        #[cfg(feature = "tls")]
        if let Some(roots) = &self.extra_roots {
            let transport =
                ratebucket_http::SmolTransport::with_tls(CONNECT_TIMEOUT, roots.config()?);
            return self.finish(transport, limiter);
        }
        self.finish(
            ratebucket_http::SmolTransport::new(CONNECT_TIMEOUT),
            limiter,
        )
    }

    /// Builds a client sending through `transport`. It needs a shared limiter
    /// ([`ClientBuilder::limiter`]): with no runtime named, none can be made here.
    pub fn build_with<T: Transport>(mut self, transport: T) -> Result<Client<T>, OpenAiError> {
        let limiter = self.limiter_or(|_, _| {
            Err(OpenAiError::Config(
                "build_with needs a limiter: pass one with ClientBuilder::limiter".into(),
            ))
        })?;
        self.finish(transport, limiter)
    }

    /// The shared limiter, checked against the limits, or one `make` builds for them.
    fn limiter_or<E>(
        &mut self,
        make: impl FnOnce(
            [ratebucket_rt::core::Limit; 2],
            ratebucket_rt::core::ArbiterConfig,
        ) -> Result<Limiter, E>,
    ) -> Result<Limiter, OpenAiError>
    where
        E: Into<ConfigError>,
    {
        let expected = self.limits.per_dimension();
        match self.limiter.take() {
            Some(limiter) => {
                check_limiter(&limiter, &expected)?;
                Ok(limiter)
            }
            None => {
                let limiter = make(expected, self.arbiter).map_err(|e| e.into().0)?;
                Ok(match self.name.take() {
                    Some(name) => limiter.with_name(name),
                    None => limiter.with_name("openai"),
                })
            }
        }
    }

    fn finish<T: Transport>(
        mut self,
        transport: T,
        limiter: Limiter,
    ) -> Result<Client<T>, OpenAiError> {
        if let Some(key) = self.key.take() {
            self.config.auth = match self.config.endpoint {
                Endpoint::Azure { .. } => Auth::ApiKey(key),
                _ => Auth::Bearer(key),
            };
        }
        let mut client = Client::new(transport, limiter, self.limits, self.config);
        client.estimator = self.estimator;
        // Everything `complete` and `stream` would refuse is refused now.
        client.target()?;
        Ok(client)
    }
}

/// A limiter that could not be made, as the configuration error it is.
struct ConfigError(OpenAiError);

impl From<ratebucket_rt::core::InvalidLimit> for ConfigError {
    fn from(e: ratebucket_rt::core::InvalidLimit) -> ConfigError {
        ConfigError(OpenAiError::Config(format!("invalid limits: {e}")))
    }
}

impl From<OpenAiError> for ConfigError {
    fn from(e: OpenAiError) -> ConfigError {
        ConfigError(e)
    }
}

/// A shared limiter must enforce the limits the client is told: two dimensions, with the
/// rate and capacity those limits give.
fn check_limiter(
    limiter: &Limiter,
    expected: &[ratebucket_rt::core::Limit],
) -> Result<(), OpenAiError> {
    if limiter.snapshot().dimensions.len() != expected.len() {
        return Err(OpenAiError::Config(format!(
            "the shared limiter has {} dimension(s); an OpenAI client needs {} (requests, tokens)",
            limiter.snapshot().dimensions.len(),
            expected.len()
        )));
    }
    for (dimension, limit) in expected.iter().enumerate() {
        let name = if dimension == REQUESTS {
            "requests"
        } else {
            "tokens"
        };
        let rate = limit
            .rate()
            .map_err(|e| OpenAiError::Config(format!("invalid {name} limit: {e}")))?;
        if limiter.dimension(dimension).map(|v| v.state.rate) != Some(rate)
            || limiter.dimension(dimension).map(|v| v.state.capacity) != Some(limit.capacity())
        {
            return Err(OpenAiError::Config(format!(
                "the shared limiter's {name} limit ({:?}, capacity {:?}) is not the one given to the client ({rate:?}, capacity {}): make it from the same Limits",
                limiter.dimension(dimension).map(|v| v.state.rate),
                limiter.dimension(dimension).map(|v| v.state.capacity),
                limit.capacity()
            )));
        }
    }
    Ok(())
}

/// The settings of the limiter a [`ClientBuilder`] makes: the defaults, with the first
/// request sent alone ([`first_alone`](ratebucket_rt::core::ArbiterConfig::first_alone)),
/// since a provider books its own estimate of each request and the first reply says how
/// much before a burst leaves at the client's. Use it for a limiter made by hand.
pub fn arbiter_config() -> ratebucket_rt::core::ArbiterConfig {
    ratebucket_rt::core::ArbiterConfig::default().with_first_alone(true)
}

/// What one chat completion reserves: 1 request and `tokens` (its estimate), the tokens
/// capped at the token bucket's capacity (a request larger than the burst still goes when
/// the bucket is full; the excess is debt).
pub fn call_cost(tokens: u64, limiter: &Limiter) -> Vec<u64> {
    let capacity = limiter
        .dimension(TOKENS)
        .map(|v| v.state.capacity)
        .unwrap_or(u64::MAX);
    let mut cost = vec![0; 2];
    cost[REQUESTS] = 1;
    cost[TOKENS] = tokens.min(capacity);
    cost
}

/// What a completion's body says it used, as a charge for a call that reserved `reserved`:
/// the reservation with its tokens replaced by the reported `usage.total_tokens`; `None`
/// when the body reports no usage.
pub fn usage_charge(reserved: &[u64], body: &[u8]) -> Option<Vec<u64>> {
    /// Only the usage: the choices are skipped, not decoded.
    #[derive(serde::Deserialize)]
    struct Reported {
        usage: Option<crate::Usage>,
    }
    let usage = serde_json::from_slice::<Reported>(body).ok()?.usage?;
    let mut actual = reserved.to_vec();
    *actual.get_mut(TOKENS)? = usage.total();
    Some(actual)
}

/// A checked destination: the URI and the signed credentials header.
struct Target {
    uri: http::Uri,
    auth: Option<(http::HeaderName, HeaderValue)>,
}

/// A 2xx body that must be a chat completion: an `error` object (some proxies answer 200
/// with one) or a body without `choices` is not one.
/// The content type of a 2xx answer to a streaming call that says it is something other
/// than an event stream; `None` for an event stream, or when no type is given (read as
/// one).
fn not_an_event_stream(headers: &http::HeaderMap) -> Option<String> {
    let kind = headers.get(http::header::CONTENT_TYPE)?.to_str().ok()?;
    let essence = kind.split(';').next().unwrap_or_default().trim();
    (!essence.eq_ignore_ascii_case("text/event-stream")).then(|| kind.to_owned())
}

fn decode_completion(body: &[u8]) -> Result<ChatCompletion, OpenAiError> {
    let value: serde_json::Value = serde_json::from_slice(body).map_err(OpenAiError::Decode)?;
    if let Some(error) = value.get("error").filter(|e| !e.is_null()) {
        let error = serde_json::from_value::<ApiError>(error.clone()).unwrap_or_default();
        return Err(OpenAiError::NotACompletion(Some(error)));
    }
    if !value
        .get("choices")
        .is_some_and(serde_json::Value::is_array)
    {
        return Err(OpenAiError::NotACompletion(None));
    }
    serde_json::from_value(value).map_err(OpenAiError::Decode)
}

impl<T> fmt::Debug for Client<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}
