//! A budget in money (`ClientBuilder::budget`) against the fake provider speaking
//! Anthropic: each message reserves its highest price and is charged what its usage cost,
//! and once the budget cannot cover one it is refused at once, nothing sent.

use ratebucket_anthropic::{
    Client, Limits, MONEY, Message, MessagesRequest, Price, Prices, Problem, Spend,
};
use ratebucket_rt::core::Period;
use ratebucket_sim::{Dialect, Headers, LimitSpec, Sim, SimConfig, SimHandle};

fn request(max_tokens: u64) -> MessagesRequest {
    MessagesRequest::new("claude-sim", max_tokens, vec![Message::user("Say hello.")])
}

fn provider() -> SimHandle {
    Sim::start(
        SimConfig::default()
            .dialect(Dialect::Anthropic)
            .api_key("sk-ant-test")
            .headers(Headers::None)
            .rpm(LimitSpec::per_minute(100_000))
            .itpm(LimitSpec::per_minute(100_000_000))
            .otpm(LimitSpec::per_minute(100_000_000))
            .completion_tokens(20, 40),
    )
    .expect("sim")
}

/// $1,000 and $2,000 per million input and output tokens.
fn price() -> Price {
    Price::new(1_000.0, 2_000.0)
}

fn client(sim: &SimHandle) -> Client<ratebucket_http::HyperTransport> {
    Client::builder(sim.base_url())
        .api_key("sk-ant-test")
        .limits(Limits::per_minute(100_000, 100_000_000, 100_000_000))
        .budget(Spend::new(1.0, Period::Day, Prices::new().model("claude-sim", price())))
        .build()
        .expect("builds")
}

#[tokio::test]
async fn messages_are_charged_what_they_used_until_the_budget_cannot_cover_one() {
    let sim = provider();
    let client = client(&sim);
    let (mut answered, mut spent) = (0, 0);
    let refusal = loop {
        match client.complete(request(200)).await {
            Ok(completion) => {
                spent += price().of(&completion.message.usage);
                answered += 1;
                assert!(answered < 100, "the budget never ran out");
            }
            Err(error) => break error,
        }
    };
    // Charged what replies used: held at the highest price, two messages would fit.
    assert!(answered >= 9, "{answered} messages answered");
    assert!(spent <= 1_000_000, "spent {spent} micro-dollars of 1,000,000");
    assert_eq!(sim.log().len(), answered, "the refused message was never sent");
    assert_eq!(refusal.problem(), Problem::BudgetSpent, "{refusal}");
    assert!(refusal.to_string().contains("renews in"), "{refusal}");
    let level = client.limiter().snapshot().dimensions[MONEY].state.level;
    assert!((level - (1_000_000 - spent) as f64).abs() < 1.0, "level {level}, spent {spent}");
}

#[tokio::test]
async fn a_streamed_message_is_charged_what_its_final_usage_cost() {
    use futures_lite::StreamExt;
    let sim = provider();
    let client = client(&sim);
    let mut stream = client.stream(request(200)).await.expect("streams");
    while let Some(event) = stream.next().await {
        event.expect("an event");
    }
    let usage = stream.usage().expect("the final usage");
    drop(stream);
    let cost = price().of(&usage);
    let level = client.limiter().snapshot().dimensions[MONEY].state.level;
    assert!(
        (level - (1_000_000 - cost) as f64).abs() < 1.0,
        "level {level} after a message that cost {cost}"
    );
}
