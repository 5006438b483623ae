//! The client builder: the limits stated once, the limiter and the transport made for them.

use std::fmt;
use std::sync::Arc;

use ratebucket_http::Transport;
use ratebucket_rt::Limiter;
use ratebucket_rt::core::{ArbiterConfig, Limit};

use crate::client::{AnthropicConfig, Client};
use crate::error::AnthropicError;
use crate::estimate::{CharsPerToken, InputEstimator};
use crate::vendor::{Limits, MONEY};
use ratebucket_http::price::Spend;

/// Builds a [`Client`] and, unless given a shared one, its limiter.
///
/// ```no_run
/// # #[tokio::main] async fn main() -> Result<(), ratebucket_anthropic::AnthropicError> {
/// use ratebucket_anthropic::{Client, Limits};
///
/// let client = Client::builder("https://api.anthropic.com")
///     .api_key("sk-ant-...")
///     .limits(Limits::per_minute(50, 40_000, 8_000))
///     .build()?;
/// # let _ = client; Ok(()) }
/// ```
#[must_use = "a builder does nothing until built"]
pub struct ClientBuilder {
    config: AnthropicConfig,
    limits: Limits,
    limiter: Option<Limiter>,
    arbiter: ArbiterConfig,
    estimator: Arc<dyn InputEstimator>,
    /// A budget for what the calls cost, and the prices.
    spend: Option<Spend>,
    name: Option<Arc<str>>,
}

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
    /// A builder for the server at `base_url` ([`Client::builder`]).
    pub(crate) fn new(base_url: impl Into<String>) -> ClientBuilder {
        ClientBuilder {
            config: AnthropicConfig::new(base_url),
            limits: Limits::unknown(),
            limiter: None,
            // The first request goes alone: its reply's headers say what the provider
            // books before the rest leave.
            arbiter: ArbiterConfig::default().with_first_alone(true),
            estimator: Arc::new(CharsPerToken),
            spend: None,
            name: None,
        }
    }
}

impl ClientBuilder {
    /// The API key, sent as `x-api-key`.
    pub fn api_key(mut self, key: impl Into<String>) -> ClientBuilder {
        self.config.api_key = Some(key.into());
        self
    }

    /// The provider's limits (per minute unless [`Limits::window`] says otherwise).
    pub fn limits(mut self, limits: Limits) -> ClientBuilder {
        self.limits = limits;
        self
    }

    /// Names the limiter the builder makes (`"anthropic"` unless named).
    pub fn name(mut self, name: impl Into<Arc<str>>) -> ClientBuilder {
        self.name = Some(name.into());
        self
    }

    /// Paces with a limiter shared with other clients (made from the same [`Limits`] with
    /// [`Limits::per_dimension`]) instead of one of its own.
    pub fn limiter(mut self, limiter: Limiter) -> ClientBuilder {
        self.limiter = Some(limiter);
        self
    }

    /// Settings of the limiter it makes.
    pub fn arbiter(mut self, config: ArbiterConfig) -> ClientBuilder {
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

    /// Changes the rest of the settings (timeouts, retries, headers, version).
    pub fn configure(
        mut self,
        f: impl FnOnce(AnthropicConfig) -> AnthropicConfig,
    ) -> ClientBuilder {
        self.config = f(self.config);
        self
    }

    /// A budget for what the calls cost ([`Spend`](crate::Spend): dollars per day, month or
    /// period, and the models' prices, cache reads and writes priced apart). The limiter
    /// gains a fourth dimension, [`MONEY`] in micro-dollars, renewed whole when each period
    /// starts: each call reserves its highest price (its input estimate and `max_tokens`)
    /// and is committed at what its usage cost, and a call the budget cannot cover is
    /// refused at once, saying when it renews. A shared limiter
    /// ([`ClientBuilder::limiter`]) must already have that dimension as a budget.
    pub fn budget(mut self, spend: Spend) -> ClientBuilder {
        self.spend = Some(spend);
        self
    }

    /// Uses another input token estimator.
    pub fn estimator(mut self, estimator: impl InputEstimator) -> ClientBuilder {
        self.estimator = Arc::new(estimator);
        self
    }

    /// Builds a client on tokio, sending through
    /// [`HyperTransport`](ratebucket_http::HyperTransport) (HTTPS with the `tls` feature).
    /// Call it inside a tokio runtime.
    #[cfg(feature = "tokio")]
    pub fn build(mut self) -> Result<Client<ratebucket_http::HyperTransport>, AnthropicError> {
        let limiter = self.limiter_or(|limits, arbiter| {
            Limiter::from_limits(limits, arbiter, ratebucket_tokio::TokioTimer::current())
        })?;
        self.finish(ratebucket_http::HyperTransport::default(), limiter)
    }

    /// Builds a client on smol, sending through
    /// [`SmolTransport`](ratebucket_http::SmolTransport).
    #[cfg(feature = "smol")]
    pub fn build_smol(mut self) -> Result<Client<ratebucket_http::SmolTransport>, AnthropicError> {
        let limiter = self.limiter_or(|limits, arbiter| {
            Limiter::from_limits(limits, arbiter, ratebucket_smol::SmolTimer)
        })?;
        self.finish(ratebucket_http::SmolTransport::default(), limiter)
    }

    /// Builds a client sending through `transport`, paced by the shared limiter given with
    /// [`ClientBuilder::limiter`] (with no runtime named, none can be made here).
    pub fn build_with<T: Transport>(mut self, transport: T) -> Result<Client<T>, AnthropicError> {
        let limiter = self.limiter_or(|_, _| {
            Err(AnthropicError::Config(
                "build_with needs a limiter: pass one with ClientBuilder::limiter".into(),
            ))
        })?;
        self.finish(transport, limiter)
    }

    /// The shared limiter, checked against the limits, or one `make` builds for them.
    fn limiter_or<E: Into<Made>>(
        &mut self,
        make: impl FnOnce(Vec<Limit>, ArbiterConfig) -> Result<Limiter, E>,
    ) -> Result<Limiter, AnthropicError> {
        let mut expected = self.limits.per_dimension().to_vec();
        if let Some(spend) = &self.spend {
            expected.push(spend.limit().map_err(AnthropicError::Config)?);
        }
        if let Some(limiter) = self.limiter.take() {
            let dimensions = limiter.snapshot().dimensions.len();
            if dimensions != expected.len() {
                return Err(AnthropicError::Config(format!(
                    "the shared limiter has {dimensions} dimension(s); an Anthropic client needs {} (requests, input tokens, output tokens{})",
                    expected.len(),
                    if expected.len() > MONEY { ", money" } else { "" }
                )));
            }
            if expected.len() > MONEY {
                Spend::check_shared(&limiter, MONEY).map_err(AnthropicError::Config)?;
            }
            return Ok(limiter);
        }
        let limiter = make(expected, self.arbiter).map_err(|e| e.into().0)?;
        if let Some(spend) = &self.spend {
            spend.set_on(&limiter, MONEY, 0).map_err(AnthropicError::Config)?;
        }
        Ok(limiter.with_name(self.name.take().unwrap_or_else(|| "anthropic".into())))
    }

    fn finish<T: Transport>(
        mut self,
        transport: T,
        limiter: Limiter,
    ) -> Result<Client<T>, AnthropicError> {
        if let Some(spend) = self.spend.take() {
            self.config.prices = Some(Arc::new(spend.prices));
        }
        let mut client = Client::new(transport, limiter, self.limits, self.config);
        client.estimator = self.estimator;
        client.check()?;
        Ok(client)
    }
}

/// A limiter that could not be made, as the configuration error it is.
struct Made(AnthropicError);

impl From<ratebucket_rt::core::InvalidLimit> for Made {
    fn from(e: ratebucket_rt::core::InvalidLimit) -> Made {
        Made(AnthropicError::Config(format!("invalid limits: {e}")))
    }
}

impl From<AnthropicError> for Made {
    fn from(e: AnthropicError) -> Made {
        Made(e)
    }
}
