//! `ratebucket batch --budget 0.5/day --prices FILE` against the fake provider: lines are
//! charged what their usage cost until the budget cannot cover one; the run stops, every
//! line kept, saying when to resume; a run started again the same day sends nothing.

mod support;

use std::time::Duration;

use ratebucket_sim::{LimitSpec, Sim, SimConfig};
use support::{records, spawn, temp_dir, write_input};

#[test]
fn a_spent_budget_stops_the_batch_and_a_new_run_the_same_day_spends_no_more() {
    let second = Duration::from_secs(1);
    let sim = Sim::start(
        SimConfig::default()
            .rpm(LimitSpec::per_minute(1_000).window(second))
            .tpm(LimitSpec::per_minute(1_000_000).window(second))
            .completion_tokens(5, 10),
    )
    .expect("fake provider");
    let dir = temp_dir("budget");
    let input = write_input(&dir, 40);
    let output = dir.join("output.jsonl");
    let prices = dir.join("prices.json");
    // $1,000 and $2,000 per million input and output tokens: a line (at most 30 output
    // tokens) reserves about $0.07 and is charged about $0.02 to $0.03.
    std::fs::write(&prices, r#"{"gpt-4o-mini": {"input": 1000, "output": 2000}}"#).expect("prices");
    let prices = prices.to_str().expect("a path");
    let args = ["--rpm", "1000", "--window", "1", "--budget", "0.5/day", "--prices", prices];
    let run = spawn(&input, &output, &sim.base_url(), &args).wait_with_output().expect("runs");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("budget") && stderr.contains("resume after 20"), "{stderr}");
    let answered = records(&output).len();
    // Charged what the answers used: at the highest price, seven lines would have fitted.
    assert!(answered >= 14, "{answered} answered: {stderr}");
    assert!(answered < 40, "{stderr}");
    let sent = sim.log().len();
    assert_eq!(sent, answered, "nothing sent beyond what was answered");
    // What the answers cost, from their usage, within the budget.
    let spent: u64 = records(&output)
        .iter()
        .map(|r| {
            let usage = &r["response"]["body"]["usage"];
            usage["prompt_tokens"].as_u64().unwrap() * 1_000
                + usage["completion_tokens"].as_u64().unwrap() * 2_000
        })
        .sum();
    assert!(spent <= 500_000, "spent {spent} micro-dollars");

    // The same day, a new run knows what was spent: it stops before sending anything.
    let again = spawn(&input, &output, &sim.base_url(), &args).wait_with_output().expect("runs");
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert_eq!(again.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("resume after 20"), "{stderr}");
    assert_eq!(sim.log().len(), sent, "the second run sent nothing: {stderr}");
    assert_eq!(records(&output).len(), answered);
}

#[test]
fn a_budget_without_prices_or_an_unpriced_model_is_refused_before_anything_is_sent() {
    let dir = temp_dir("budget-bad");
    let input = write_input(&dir, 2);
    let output = dir.join("output.jsonl");
    let prices = dir.join("prices.json");
    std::fs::write(&prices, r#"{"o3": {"input": 2, "output": 8}}"#).expect("prices");
    let prices = prices.to_str().expect("a path");
    for (args, says) in [
        (vec!["--budget", "5/day"], "--prices"),
        (vec!["--budget", "5/week", "--prices", prices], "`day` or `month`"),
        (vec!["--budget", "5/day", "--prices", prices], "`gpt-4o-mini`"),
    ] {
        let run =
            spawn(&input, &output, "http://127.0.0.1:9", &args).wait_with_output().expect("runs");
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert_eq!(run.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}
