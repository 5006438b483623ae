//! The client builder: the limits stated once, the limiter and the transport made for them.

use std::fmt;
use std::sync::Arc;

use ratebucket_http::Transport;
use ratebucket_rt::Limiter;

use crate::client::{Auth, Client, Endpoint, OpenAiConfig};
use crate::error::OpenAiError;
use crate::estimate::{CharsPerToken, TokenEstimator};
use crate::vendor::{Limits, MONEY, REQUESTS};
use ratebucket_http::price::Spend;

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
    /// A budget for what the calls cost, and the prices.
    spend: Option<Spend>,
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

/// The TLS settings a built-in transport is given when the builder trusts extra roots.
#[cfg(feature = "tls")]
type Roots = ratebucket_http::tls::rustls::ClientConfig;
/// Without TLS there are none to give.
#[cfg(all(not(feature = "tls"), any(feature = "tokio", feature = "smol")))]
type Roots = std::convert::Infallible;

/// How long a built-in transport tries to connect.
#[cfg(any(feature = "tokio", feature = "smol"))]
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

impl ClientBuilder {
    /// A builder posting to `endpoint` ([`Client::builder`]).
    pub(crate) fn new(endpoint: impl Into<Endpoint>) -> ClientBuilder {
        ClientBuilder {
            config: OpenAiConfig::new(endpoint.into(), Auth::None),
            key: None,
            limits: Limits::unknown(),
            limiter: None,
            arbiter: arbiter_config(),
            estimator: Arc::new(CharsPerToken),
            name: None,
            spend: None,
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

    /// Reads the provider's rate-limit signals in `dialect` (`ratebucket_http::dialect::GROQ`
    /// for Groq, whose `x-ratelimit-*-requests` count per day; a dialect by name with
    /// [`Dialect::named`](ratebucket_http::dialect::Dialect::named)). Unset, a dialect is
    /// recognised from each reply where that is unambiguous, and OpenAI's read otherwise.
    pub fn dialect(mut self, dialect: &'static ratebucket_http::dialect::Dialect) -> ClientBuilder {
        self.config.dialect = Some(dialect);
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

    /// At most `most` requests in flight at once (0 is taken as 1), each held from its grant
    /// until its answer ends (a stream's last event). Without it, a bound is learned from
    /// the provider's refusals for requests in flight ("Concurrency limit exceeded") and
    /// raised again by its answers. A later [`ClientBuilder::arbiter`] replaces it.
    pub fn max_in_flight(mut self, most: u32) -> ClientBuilder {
        self.arbiter = self.arbiter.with_max_in_flight(Some(most.max(1)));
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

    /// A budget for what the calls cost ([`Spend`]: dollars per day, month or period, and
    /// the models' prices). The limiter gains a third dimension, [`MONEY`] in
    /// micro-dollars, renewed whole when each period starts (midnight UTC for a day, the
    /// first for a month): each call reserves its highest price and is committed at what
    /// its usage cost, and a call the budget cannot cover is refused at once
    /// ([`Problem::BudgetSpent`](crate::Problem::BudgetSpent)), saying when it renews. A
    /// shared limiter ([`ClientBuilder::limiter`]) must already have that dimension as a
    /// budget ([`Change::Budget`](ratebucket_rt::core::Change::Budget)); the budget is
    /// not set again.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// use ratebucket_openai::{Client, Limits, Price, Prices, Spend};
    /// use ratebucket_rt::core::Period;
    ///
    /// let prices = Prices::new().model("gpt-4o-mini", Price::new(0.15, 0.6).cached(0.075));
    /// let client = Client::builder("https://api.openai.com")
    ///     .api_key("sk-...")
    ///     .limits(Limits::per_minute(500, 200_000))
    ///     .budget(Spend::new(20.0, Period::Day, prices))
    ///     .build()?;
    /// # let _ = client; Ok(()) }
    /// ```
    pub fn budget(mut self, spend: Spend) -> ClientBuilder {
        self.spend = Some(spend);
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
        let transport = self.built_in(|roots| match roots {
            #[cfg(feature = "tls")]
            Some(tls) => ratebucket_http::HyperTransport::with_tls(CONNECT_TIMEOUT, tls),
            _ => ratebucket_http::HyperTransport::new(CONNECT_TIMEOUT),
        })?;
        self.finish(transport, limiter)
    }

    /// Builds a client on smol, sending through
    /// [`SmolTransport`](ratebucket_http::SmolTransport) (HTTPS with the `tls` feature).
    #[cfg(feature = "smol")]
    pub fn build_smol(mut self) -> Result<Client<ratebucket_http::SmolTransport>, OpenAiError> {
        let limiter = self.limiter_or(|limits, arbiter| {
            Limiter::from_limits(limits, arbiter, ratebucket_smol::SmolTimer)
        })?;
        let transport = self.built_in(|roots| match roots {
            #[cfg(feature = "tls")]
            Some(tls) => ratebucket_http::SmolTransport::with_tls(CONNECT_TIMEOUT, tls),
            _ => ratebucket_http::SmolTransport::new(CONNECT_TIMEOUT),
        })?;
        self.finish(transport, limiter)
    }

    /// A built-in transport, from `make`: given the TLS settings with the extra roots
    /// added when the builder trusts any, `None` for the defaults.
    #[cfg(any(feature = "tokio", feature = "smol"))]
    fn built_in<T>(&self, make: impl FnOnce(Option<Roots>) -> T) -> Result<T, OpenAiError> {
        #[cfg(feature = "tls")]
        if let Some(roots) = &self.extra_roots {
            return Ok(make(Some(roots.config()?)));
        }
        Ok(make(None))
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
            Vec<ratebucket_rt::core::Limit>,
            ratebucket_rt::core::ArbiterConfig,
        ) -> Result<Limiter, E>,
    ) -> Result<Limiter, OpenAiError>
    where
        E: Into<ConfigError>,
    {
        let mut expected = self.limits.per_dimension().to_vec();
        let budget = match &self.spend {
            Some(spend) => {
                expected.push(spend.limit().map_err(OpenAiError::Config)?);
                Some(spend.clone())
            }
            None => None,
        };
        match self.limiter.take() {
            Some(limiter) => {
                check_limiter(&limiter, &expected)?;
                Ok(limiter)
            }
            None => {
                let limiter = make(expected, self.arbiter).map_err(|e| e.into().0)?;
                if let Some(spend) = budget {
                    spend.set_on(&limiter, MONEY, 0).map_err(OpenAiError::Config)?;
                }
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
        if let Some(spend) = self.spend.take() {
            self.config.prices = Some(Arc::new(spend.prices));
        }
        let mut client = Client::new(transport, limiter, self.limits, self.config);
        client.estimator = self.estimator;
        // Everything `complete` and `stream` would refuse is refused now.
        client.check()?;
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
            "the shared limiter has {} dimension(s); an OpenAI client needs {} (requests, tokens{})",
            limiter.snapshot().dimensions.len(),
            expected.len(),
            if expected.len() > MONEY { ", money" } else { "" }
        )));
    }
    if expected.len() > MONEY {
        Spend::check_shared(limiter, MONEY).map_err(OpenAiError::Config)?;
    }
    for (dimension, limit) in expected.iter().enumerate().take(MONEY) {
        let name = if dimension == REQUESTS { "requests" } else { "tokens" };
        let rate =
            limit.rate().map_err(|e| OpenAiError::Config(format!("invalid {name} limit: {e}")))?;
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
/// much before a burst leaves at the client's; and reserving what replies use
/// ([`reserve_usage`](ratebucket_rt::core::ArbiterConfig::reserve_usage)) once the reports
/// show the provider charges usage after the reply rather than `max_tokens` at admission.
/// Use it for a limiter made by hand.
pub fn arbiter_config() -> ratebucket_rt::core::ArbiterConfig {
    ratebucket_rt::core::ArbiterConfig::default().with_first_alone(true).with_reserve_usage(true)
}
