//! A day's budget in dollars against the fake provider on localhost: 200 calls fired at
//! once, each reserving its highest price and charged what its usage cost, until the
//! budget cannot cover one more; the rest are refused at once, saying when it renews.
//! Run with `cargo run -p ratebucket-openai --example budget`.

use ratebucket_openai::{
    ChatRequest, Client, Limits, MONEY, Message, Price, Prices, Problem, Spend,
};
use ratebucket_rt::core::Period;
use ratebucket_sim::{LimitSpec, Sim, SimConfig};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let sim = Sim::start(
        SimConfig::default()
            .rpm(LimitSpec::per_minute(100_000))
            .tpm(LimitSpec::per_minute(100_000_000))
            .completion_tokens(20, 200),
    )?;
    // Dollars per million tokens (input, output), and a cheaper cached input.
    let prices = Prices::new().model("gpt-4o", Price::new(2.5, 10.0).cached(1.25));
    let client = Client::builder(sim.base_url())
        .limits(Limits::per_minute(100_000, 100_000_000))
        .budget(Spend::new(0.10, Period::Day, prices.clone()))
        .build()?;
    let calls: Vec<_> = (0..200)
        .map(|i| {
            let client = client.clone();
            let request =
                ChatRequest::new("gpt-4o", vec![Message::user(format!("Summarise document {i}."))])
                    .max_tokens(400);
            tokio::spawn(async move { client.complete(request).await })
        })
        .collect();
    let (mut answered, mut spent, mut refused) = (0, 0, Vec::new());
    for call in calls {
        match call.await? {
            Ok(answer) => {
                answered += 1;
                let usage = answer.completion.usage.unwrap_or_default();
                spent += prices.price("gpt-4o").map_or(0, |p| p.of(&usage));
            }
            Err(e) if e.problem() == Problem::BudgetSpent => refused.push(e),
            Err(e) => return Err(e.into()),
        }
    }
    let left = client.limiter().snapshot().dimensions[MONEY].state.level;
    println!(
        "{answered} answered for ${:.4} of $0.10 (${:.4} left); {} refused at once, none sent",
        spent as f64 / 1e6,
        left / 1e6,
        refused.len()
    );
    if let Some(first) = refused.first() {
        println!("{first}");
    }
    assert_eq!(sim.log().len(), answered, "a refused call never left");
    assert!(spent <= 100_000, "the budget held");
    Ok(())
}
