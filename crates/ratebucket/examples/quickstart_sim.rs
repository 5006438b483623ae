//! The quick start against the fake provider, no key needed:
//! `cargo run -p ratebucket --features sim --example quickstart_sim`.

use ratebucket::openai::{ChatRequest, Client, Limits, Message};
use ratebucket::sim::{LimitSpec, Sim, SimConfig};
use ratebucket::tokio;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let sim = Sim::start(
        SimConfig::default().rpm(LimitSpec::per_minute(500)).tpm(LimitSpec::per_minute(200_000)),
    )?;
    let client =
        Client::builder(sim.base_url()).limits(Limits::per_minute(500, 200_000)).build()?;
    let request = ChatRequest::new("gpt-4o-mini", vec![Message::user("Say hello.")]);
    let answer = client.complete(request).await?;
    println!("{}", answer.completion.text().unwrap_or_default());
    Ok(())
}
