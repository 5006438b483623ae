//! `bench/timeline.png`: for each scenario, one row per engine; a grey tick per admitted
//! request, a red tick per 429, so pauses show as gaps.

use std::path::Path;

use plotters::prelude::*;
use plotters::style::FontStyle;

use super::{Run, Scenario};

const FONT_PATHS: [&str; 3] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
];

fn register_font() -> Result<(), String> {
    let bytes = FONT_PATHS
        .iter()
        .find_map(|p| std::fs::read(p).ok())
        .ok_or("no DejaVu Sans font found: install fonts-dejavu-core to draw the chart")?;
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
        .map_err(|_| "the DejaVu Sans font could not be read".to_owned())
}

pub(crate) fn timeline(all: &[(Scenario, Vec<Run>)], path: &Path) -> Result<(), String> {
    register_font()?;
    let panel_height = 300;
    let height = (panel_height * all.len().max(1)) as u32;
    let root = BitMapBackend::new(path, (1400, height)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let panels = root.split_evenly((all.len().max(1), 1));
    for ((scenario, runs), panel) in all.iter().zip(panels.iter()) {
        draw_panel(scenario, runs, panel).map_err(|e| e.to_string())?;
    }
    root.present().map_err(|e| e.to_string())?;
    Ok(())
}

fn draw_panel(
    scenario: &Scenario,
    runs: &[Run],
    area: &DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>,
) -> Result<(), Box<dyn std::error::Error>> {
    let end = runs
        .iter()
        .flat_map(|r| r.log.iter().filter_map(|e| e.finished.or(Some(e.arrived))))
        .max()
        .map_or(1.0, |d| d.as_secs_f64())
        .max(0.1);
    let rows = runs.len() as f64;
    let mut chart = ChartBuilder::on(area)
        .caption(
            format!("{}: {} requests ({})", scenario.name, scenario.requests, scenario.description),
            ("sans-serif", 16),
        )
        .margin(8)
        .x_label_area_size(28)
        .y_label_area_size(150)
        .build_cartesian_2d(0.0..end * 1.02, 0.0..rows)?;
    let names: Vec<&str> = runs.iter().map(|r| r.engine).collect();
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(runs.len() * 2 + 1)
        .y_label_formatter(&|y| {
            let i = (rows - y - 0.5).round();
            let on_center = ((rows - y - 0.5) - i).abs() < 0.05;
            if on_center && i >= 0.0 && (i as usize) < names.len() {
                names[i as usize].to_owned()
            } else {
                String::new()
            }
        })
        .x_desc("seconds since the batch started")
        .label_style(("sans-serif", 13))
        .draw()?;
    for (row, run) in runs.iter().enumerate() {
        let base = rows - row as f64 - 1.0;
        let admitted = run.log.iter().filter(|e| e.admitted).map(|e| e.arrived.as_secs_f64());
        chart.draw_series(admitted.map(|t| {
            PathElement::new(
                vec![(t, base + 0.15), (t, base + 0.55)],
                RGBColor(90, 90, 90).mix(0.35),
            )
        }))?;
        let throttled =
            run.log.iter().filter(|e| e.status == Some(429)).map(|e| e.arrived.as_secs_f64());
        chart.draw_series(throttled.map(|t| {
            PathElement::new(vec![(t, base + 0.55), (t, base + 0.9)], RED.mix(0.8).stroke_width(2))
        }))?;
        let label = format!(
            "{:.2} s ({:.2}x bound), {} x 429, {} failed",
            run.makespan_s, run.ratio, run.throttled, run.failed
        );
        chart.draw_series(std::iter::once(Text::new(
            label,
            (end * 0.01, base + 0.97),
            ("sans-serif", 12).into_font(),
        )))?;
    }
    Ok(())
}
