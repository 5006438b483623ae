//! A batch's budget in money (`--budget 20/day --prices FILE`): each line's highest price,
//! the money dimension made a budget, and what earlier runs spent of the current period.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ratebucket_http::price::{Billed, Price, Prices, Spend};
use ratebucket_rt::Limiter;
use ratebucket_rt::core::Period;
use serde_json::Value;

use crate::api::Api;
use crate::input::Line;
use crate::store::Resume;

/// A budget for the run: the money dimension's index (after the API's own), the spend,
/// and what was spent of the current period before this run.
#[derive(Clone, Debug)]
pub(crate) struct Budgeted {
    pub(crate) dimension: usize,
    pub(crate) spend: Spend,
    pub(crate) spent: u64,
}

/// The model a line's body names.
fn model(line: &Line) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Named {
        model: String,
    }
    serde_json::from_slice::<Named>(&line.body).ok().map(|n| n.model)
}

/// A line's model's price, or an error naming the line's model.
pub(crate) fn price_of(line: &Line, prices: &Prices) -> Result<Price, String> {
    let model = model(line).unwrap_or_default();
    prices.price(&model).ok_or_else(|| {
        format!("line `{}`: the price table has no price for model `{model}`", line.custom_id)
    })
}

/// The most a line can cost, in micro-dollars: its prompt estimate at the input price and
/// every completion token it may produce at the output price.
pub(crate) fn most(line: &Line, price: Price, default_max_tokens: u64) -> u64 {
    let completion = line.upper_bound(default_max_tokens) - line.prompt_tokens;
    price.most(line.prompt_tokens, completion)
}

/// What the answer recorded for a line cost, if its record holds a priced usage.
pub(crate) fn recorded_bill(api: Api, record: &Value) -> Option<(String, Billed)> {
    use ratebucket_http::price::Usage;
    let body = match api {
        Api::OpenAi => &record["response"]["body"],
        Api::Anthropic => &record["result"]["message"],
    };
    let model = body["model"].as_str()?.to_owned();
    let usage = body.get("usage")?.clone();
    let billed = match api {
        Api::OpenAi => serde_json::from_value::<ratebucket_openai::Usage>(usage).ok()?.billed(),
        Api::Anthropic => {
            serde_json::from_value::<ratebucket_anthropic::Usage>(usage).ok()?.billed()
        }
    };
    Some((model, billed))
}

/// What the sends of earlier runs in the current period cost: each answered one at what its
/// recorded usage cost, each unanswered one (it may have been billed) at its highest price.
/// A budget renewed every fixed period has no calendar: earlier runs' sends are not
/// counted.
pub(crate) fn spent_before(
    resume: &Resume,
    lines: &HashMap<&str, &Line>,
    spend: &Spend,
    default_max_tokens: u64,
    now: SystemTime,
) -> u64 {
    let since_epoch = now.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO);
    let Some(started) = spend.period.started(since_epoch) else {
        return 0;
    };
    let started = UNIX_EPOCH + started;
    resume
        .sends
        .iter()
        .filter(|send| send.at >= started)
        .map(|send| match resume.billed.get(&send.id) {
            Some((model, billed)) => spend.prices.price(model).map_or(0, |p| p.of(billed)),
            None => lines
                .get(send.id.as_str())
                .and_then(|line| {
                    let price = price_of(line, &spend.prices).ok()?;
                    Some(most(line, price, default_max_tokens))
                })
                .unwrap_or(0),
        })
        .fold(0, u64::saturating_add)
}

/// Makes the limiter's money dimension the budget, less what earlier runs spent of it.
pub(crate) fn apply(limiter: &Limiter, budget: &Budgeted) -> Result<(), String> {
    budget
        .spend
        .set_on(limiter, budget.dimension, budget.spent)
        .map_err(|e| format!("--budget: {e}"))
}

/// `AMOUNT/PERIOD` (`20/day`, `500/month`), for `--budget`: dollars per day or month.
pub(crate) fn parse_budget(text: &str) -> Result<(f64, Period), String> {
    let (amount, period) = text
        .split_once('/')
        .ok_or_else(|| format!("`{text}`: expected DOLLARS/PERIOD, such as 20/day"))?;
    let dollars: f64 = amount
        .trim()
        .trim_start_matches('$')
        .parse()
        .map_err(|_| format!("`{amount}`: an amount of dollars, such as 20 or 7.5"))?;
    if !dollars.is_finite() || dollars <= 0.0 {
        return Err(format!("`{amount}`: the budget must be above 0"));
    }
    let period = match period.trim() {
        "day" => Period::Day,
        "month" => Period::Month,
        other => return Err(format!("`{other}`: a budget renews each `day` or `month`")),
    };
    Ok((dollars, period))
}
