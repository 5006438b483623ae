//! The quick start against a real provider: `OPENAI_API_KEY=sk-... cargo run -p ratebucket --example quickstart`.

use ratebucket::openai::{ChatRequest, Client, Limits, Message};
use ratebucket::tokio;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let client = Client::builder("https://api.openai.com")
        .api_key(std::env::var("OPENAI_API_KEY")?)
        .limits(Limits::per_minute(500, 200_000))
        .build()?;
    let request = ChatRequest::new("gpt-4o-mini", vec![Message::user("Say hello.")]);
    let answer = client.complete(request).await?;
    println!("{}", answer.completion.text().unwrap_or_default());
    Ok(())
}
