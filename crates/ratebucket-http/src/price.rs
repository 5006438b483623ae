//! Money as a dimension: prices per model, from a table the user supplies, and a budget
//! over them (in micro-dollars, a millionth of a dollar) that refuses a call at once when
//! it is spent. Shared by the chat clients, each of which says what its usage reports.

use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ratebucket_rt::Limiter;
use ratebucket_rt::core::{Budget, Change, InvalidLimit, Limit, Period};
use serde::Deserialize;

/// A reply's tokens as they are priced: fresh prompt tokens, prompt tokens read from the
/// provider's cache, prompt tokens written to it, and completion tokens.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Billed {
    /// Prompt tokens neither read from nor written to the cache.
    pub input: u64,
    /// Prompt tokens read from the cache.
    pub cached_input: u64,
    /// Prompt tokens written to the cache.
    pub cache_write: u64,
    /// Completion tokens (reasoning tokens among them).
    pub output: u64,
}

/// A provider's usage report, as [`Billed`] tokens.
pub trait Usage {
    /// The tokens, as they are priced.
    fn billed(&self) -> Billed;
}

/// What one model costs, in dollars per million tokens (which is micro-dollars per
/// token), as providers list their prices.
#[derive(Clone, Copy, Debug, PartialEq, Deserialize)]
pub struct Price {
    /// Per million prompt tokens neither read from nor written to the provider's cache.
    pub input: f64,
    /// Per million prompt tokens read from the cache; the input price when the table
    /// leaves it out.
    #[serde(default)]
    pub cached_input: Option<f64>,
    /// Per million prompt tokens written to the cache (Anthropic's cache writes); the
    /// input price when the table leaves it out.
    #[serde(default)]
    pub cache_write: Option<f64>,
    /// Per million completion tokens (reasoning tokens among them).
    pub output: f64,
}

impl Price {
    /// Input and output prices, cached input and cache writes at the input price.
    pub fn new(input: f64, output: f64) -> Price {
        Price { input, cached_input: None, cache_write: None, output }
    }

    /// The price of cached input tokens.
    pub fn cached(mut self, cached_input: f64) -> Price {
        self.cached_input = Some(cached_input);
        self
    }

    /// The price of input tokens written to the cache.
    pub fn cache_write(mut self, cache_write: f64) -> Price {
        self.cache_write = Some(cache_write);
        self
    }

    /// The most a call can cost, in micro-dollars, rounded up: every prompt token at the
    /// input price (none assumed cached) and every completion token it may produce.
    pub fn most(&self, prompt_tokens: u64, completion_tokens: u64) -> u64 {
        micro(prompt_tokens as f64 * self.input + completion_tokens as f64 * self.output)
    }

    /// What `usage` cost, in micro-dollars, rounded up: each kind of token at its price.
    pub fn of(&self, usage: &impl Usage) -> u64 {
        let billed = usage.billed();
        micro(
            billed.input as f64 * self.input
                + billed.cached_input as f64 * self.cached_input.unwrap_or(self.input)
                + billed.cache_write as f64 * self.cache_write.unwrap_or(self.input)
                + billed.output as f64 * self.output,
        )
    }

    /// Why the price cannot be used, if it cannot: a negative or non-finite number.
    fn invalid(&self) -> Option<&'static str> {
        let all = [
            self.input,
            self.cached_input.unwrap_or(0.0),
            self.cache_write.unwrap_or(0.0),
            self.output,
        ];
        all.iter()
            .any(|p| !p.is_finite() || *p < 0.0)
            .then_some("prices must be finite and not negative")
    }
}

/// Micro-dollars, rounded up (past float noise), saturating.
fn micro(amount: f64) -> u64 {
    (amount * (1.0 - 1e-12)).ceil().clamp(0.0, u64::MAX as f64) as u64
}

/// The prices of the models a client calls, by name. A model is priced by its own entry,
/// else by the longest entry its name starts with (`gpt-4o` prices `gpt-4o-2024-08-06`,
/// `gpt-4o-mini` prices `gpt-4o-mini-2024-07-18`), as providers answer with dated names.
///
/// From JSON (the batch CLI's `--prices FILE`): `{"gpt-4o": {"input": 2.5,
/// "cached_input": 1.25, "output": 10}}`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Prices {
    models: BTreeMap<String, Price>,
}

impl Prices {
    /// No model priced.
    pub fn new() -> Prices {
        Prices::default()
    }

    /// Prices `model` at `price`.
    pub fn model(mut self, model: impl Into<String>, price: Price) -> Prices {
        self.models.insert(model.into(), price);
        self
    }

    /// A table read from JSON: an object from model names to prices, each with `input`,
    /// `output` and optionally `cached_input` (dollars per million tokens).
    pub fn from_json(json: &str) -> Result<Prices, String> {
        let models: BTreeMap<String, Price> = serde_json::from_str(json).map_err(|e| {
            format!("not a price table ({e}); expected {{\"model\": {{\"input\": 2.5, \"output\": 10}}}}")
        })?;
        let prices = Prices { models };
        prices.check()?;
        Ok(prices)
    }

    /// The price of `model`: its own, or the longest entry its name starts with.
    pub fn price(&self, model: &str) -> Option<Price> {
        if let Some(price) = self.models.get(model) {
            return Some(*price);
        }
        self.models
            .iter()
            .filter(|(name, _)| model.starts_with(name.as_str()))
            .max_by_key(|(name, _)| name.len())
            .map(|(_, price)| *price)
    }

    /// Whether no model is priced.
    pub fn is_empty(&self) -> bool {
        self.models.is_empty()
    }

    /// An error naming the first unusable price.
    pub fn check(&self) -> Result<(), String> {
        for (model, price) in &self.models {
            if let Some(why) = price.invalid() {
                return Err(format!("the price of `{model}` is unusable: {why}"));
            }
        }
        Ok(())
    }
}

/// A budget for what a client's calls cost: `dollars` per [`Period`], priced by
/// [`Prices`]. Each call reserves its highest price (its prompt estimate at the input
/// price, every completion token it may produce at the output price) and is committed at
/// what its reported usage cost; a call the budget cannot cover is refused at once
/// ([`Problem::BudgetSpent`](crate::Problem::BudgetSpent)), saying when the budget renews.
/// A call to a model the table does not price is refused before anything is reserved.
#[derive(Clone, Debug, PartialEq)]
pub struct Spend {
    /// Dollars per period.
    pub dollars: f64,
    /// How often the budget renews (a calendar day or month, UTC, or a fixed period).
    pub period: Period,
    /// The models' prices.
    pub prices: Prices,
}

impl Spend {
    /// `dollars` per `period`, priced by `prices`.
    pub fn new(dollars: f64, period: Period, prices: Prices) -> Spend {
        Spend { dollars, period, prices }
    }

    /// The budget in micro-dollars, or why it cannot be one.
    pub fn micro_dollars(&self) -> Result<u64, String> {
        self.prices.check()?;
        if !self.dollars.is_finite() || self.dollars <= 0.0 || self.dollars > 1e12 {
            return Err(format!(
                "a budget of {} dollars is not usable: give a positive amount",
                self.dollars
            ));
        }
        Ok(micro(self.dollars * 1e6))
    }

    /// The money dimension's limit: the amount over the period's nominal length (a month
    /// counts 30 days), named `micro-dollars`. Make it a budget with [`Spend::set_on`].
    pub fn limit(&self) -> Result<Limit, String> {
        let nominal = match self.period {
            Period::Day => Duration::from_secs(86_400),
            Period::Every(every) => every,
            _ => Duration::from_secs(30 * 86_400),
        };
        Ok(Limit::per(self.micro_dollars()?, nominal).named("micro-dollars"))
    }

    /// Makes `limiter`'s `dimension` this budget
    /// ([`Change::Budget`]), its periods found from
    /// the wall clock, with `spent` micro-dollars of the current period already gone (what
    /// earlier runs spent; zero for a budget that starts now).
    pub fn set_on(&self, limiter: &Limiter, dimension: usize, spent: u64) -> Result<(), String> {
        let since_epoch = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_err(|e| format!("the clock is before 1970: {e}"))?;
        let amount = self.micro_dollars()?;
        let budget = Budget { amount, period: self.period, since_epoch };
        let invalid = |e: InvalidLimit| format!("invalid budget: {e}");
        limiter.change(dimension, Change::Budget(budget)).map_err(invalid)?;
        if spent > 0 {
            limiter.change(dimension, Change::Withdraw).map_err(invalid)?;
            limiter
                .change(dimension, Change::Fund(amount.saturating_sub(spent)))
                .map_err(invalid)?;
        }
        Ok(())
    }

    /// Checks that a shared `limiter`'s `dimension` is a budget already (one a client was
    /// not given the chance to set).
    pub fn check_shared(limiter: &Limiter, dimension: usize) -> Result<(), String> {
        match limiter.dimension(dimension) {
            Some(view) if view.state.renews_at.is_some() => Ok(()),
            _ => Err(format!(
                "the shared limiter's dimension {dimension} (money) is not a budget: set one with Change::Budget"
            )),
        }
    }
}

impl fmt::Display for Spend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "${} per {:?}", self.dollars, self.period)
    }
}

impl Usage for Billed {
    fn billed(&self) -> Billed {
        *self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_model_is_priced_by_its_longest_prefix_and_usage_by_its_parts() {
        let prices = Prices::new()
            .model("gpt-4o", Price::new(2.5, 10.0).cached(1.25))
            .model("gpt-4o-mini", Price::new(0.15, 0.6));
        assert_eq!(prices.price("gpt-4o-2024-08-06"), prices.price("gpt-4o"));
        assert_eq!(prices.price("gpt-4o-mini-2024-07-18"), Some(Price::new(0.15, 0.6)));
        assert_eq!(prices.price("o3"), None);
        let price = prices.price("gpt-4o").unwrap();
        // 1,000 prompt tokens and at most 500 out: $0.0025 + $0.005.
        assert_eq!(price.most(1_000, 500), 7_500);
        let usage = Billed { input: 600, cached_input: 400, cache_write: 0, output: 100 };
        // 600 fresh at 2.5, 400 cached at 1.25, 100 out at 10.
        assert_eq!(price.of(&usage), 1_500 + 500 + 1_000);
        let written = Billed { cache_write: 1_000, ..Billed::default() };
        assert_eq!(price.cache_write(3.125).of(&written), 3_125);
    }

    #[test]
    fn unusable_tables_and_budgets_are_refused_with_the_reason() {
        assert!(Prices::from_json("[1, 2]").unwrap_err().contains("price table"));
        let negative = r#"{"m": {"input": -1, "output": 2}}"#;
        assert!(Prices::from_json(negative).unwrap_err().contains("`m`"));
        let table = Prices::from_json(r#"{"m": {"input": 1, "output": 2}}"#).unwrap();
        assert_eq!(table.price("m"), Some(Price::new(1.0, 2.0)));
        for dollars in [0.0, -5.0, f64::NAN, f64::INFINITY] {
            let spend = Spend::new(dollars, Period::Day, table.clone());
            assert!(spend.micro_dollars().is_err(), "{dollars}");
        }
        assert_eq!(Spend::new(2.5, Period::Day, table).micro_dollars(), Ok(2_500_000));
    }
}
