//! A budget in money (`ClientBuilder::budget`) against the fake provider: each call
//! reserves its highest price and is charged what its usage cost, and once the budget
//! cannot cover a call it is refused at once, nothing sent, saying when the budget renews.

use ratebucket_openai::{
    ChatRequest, Client, Limits, MONEY, Message, OpenAiError, Price, Prices, Problem, Spend,
};
use ratebucket_rt::ReserveError;
use ratebucket_rt::core::Period;
use ratebucket_sim::{Headers, LimitSpec, Sim, SimConfig, SimHandle};

fn prompt(max_tokens: u64) -> ChatRequest {
    ChatRequest::new("gpt-4o-mini", vec![Message::user("Say hello.")]).max_tokens(max_tokens)
}

/// A provider with roomy limits whose replies use 20 to 40 completion tokens.
fn provider() -> SimHandle {
    Sim::start(
        SimConfig::default()
            .headers(Headers::None)
            .rpm(LimitSpec::per_minute(100_000))
            .tpm(LimitSpec::per_minute(100_000_000))
            .completion_tokens(20, 40),
    )
    .expect("sim")
}

/// $1,000 and $2,000 per million input and output tokens: a call of 200 `max_tokens`
/// reserves more than $0.40 and is charged about $0.07 to $0.10.
fn prices() -> Prices {
    Prices::new().model("gpt-4o-mini", Price::new(1_000.0, 2_000.0))
}

/// A client with roomy limits and a budget of $1 a day.
fn client(sim: &SimHandle) -> Client<ratebucket_http::HyperTransport> {
    Client::builder(sim.base_url())
        .limits(Limits::per_minute(100_000, 100_000_000))
        .budget(Spend::new(1.0, Period::Day, prices()))
        .build()
        .expect("builds")
}

#[tokio::test]
async fn calls_are_charged_what_they_used_until_the_budget_cannot_cover_one() {
    let sim = provider();
    let client = client(&sim);
    let mut spent = 0;
    let mut answered = 0;
    let refusal = loop {
        match client.complete(prompt(200)).await {
            Ok(completion) => {
                let usage = completion.completion.usage.expect("usage");
                spent += Price::new(1_000.0, 2_000.0).of(&usage);
                answered += 1;
                assert!(answered < 100, "the budget never ran out");
            }
            Err(error) => break error,
        }
    };
    // Charged what replies used: a budget held at the highest price would have covered
    // two calls.
    assert!(answered >= 9, "{answered} calls answered");
    assert!(spent <= 1_000_000, "spent {spent} micro-dollars of 1,000,000");
    // Nothing left the client for the refused call.
    assert_eq!(sim.log().len(), answered);
    assert_eq!(refusal.problem(), Problem::BudgetSpent, "{refusal}");
    let OpenAiError::Fetch(fetch) = &refusal else { panic!("{refusal:?}") };
    let ratebucket_http::FetchErrorKind::Limiter(ReserveError::BudgetSpent {
        dimension,
        renews_in,
    }) = fetch.kind()
    else {
        panic!("{fetch:?}")
    };
    assert_eq!(*dimension, MONEY);
    assert!(renews_in.as_secs() <= 86_400, "{renews_in:?}");
    assert!(refusal.to_string().contains("renews in"), "{refusal}");
    // What is left still covers a smaller call.
    let level = client.limiter().snapshot().dimensions[MONEY].state.level;
    assert!(level >= 1_000_000.0 - spent as f64 - 1.0, "level {level}, spent {spent}");
    if level > 80_000.0 {
        client.complete(prompt(30)).await.expect("a small call fits");
    }
}

#[tokio::test]
async fn a_model_without_a_price_is_refused_before_anything_is_reserved() {
    let sim = provider();
    let client = client(&sim);
    let request = ChatRequest::new("o3", vec![Message::user("Hi.")]).max_tokens(10);
    let error = client.complete(request).await.unwrap_err();
    assert_eq!(error.problem(), Problem::Config, "{error}");
    assert!(error.to_string().contains("`o3`"), "{error}");
    assert!(sim.log().is_empty());
    let bad = Spend::new(-1.0, Period::Day, prices());
    let refused = Client::builder(sim.base_url()).budget(bad).build();
    assert!(refused.is_err());
}

#[tokio::test]
async fn a_streamed_call_is_charged_what_its_final_usage_cost() {
    use futures_lite::StreamExt;
    let sim = provider();
    let client = client(&sim);
    let mut stream = client.stream(prompt(200)).await.expect("streams");
    while let Some(chunk) = stream.next().await {
        chunk.expect("a chunk");
    }
    let usage = stream.usage().expect("the final chunk's usage");
    drop(stream);
    let cost = Price::new(1_000.0, 2_000.0).of(&usage);
    let level = client.limiter().snapshot().dimensions[MONEY].state.level;
    assert!(
        (level - (1_000_000 - cost) as f64).abs() < 1.0,
        "level {level} after a call that cost {cost}"
    );
}
