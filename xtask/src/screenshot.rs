//! `cargo xtask screenshot`: the README's picture of `ratebucket batch` at work, a real
//! terminal capture (script(1)) of the example batch against the fake provider, replayed
//! through a small terminal model and drawn to `docs/batch-progress.png`.

use std::path::Path;
use std::process::Command;

use plotters::prelude::*;
use plotters::style::FontStyle;

const COLUMNS: usize = 104;
const FONTS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSansMono.ttf",
    "/usr/share/fonts/dejavu/DejaVuSansMono.ttf",
    "/usr/share/fonts/TTF/DejaVuSansMono.ttf",
];

/// One cell of the terminal: a character and its colour.
#[derive(Clone, Copy)]
struct Cell {
    ch: char,
    color: RGBColor,
}

const FOREGROUND: RGBColor = RGBColor(220, 220, 220);
const BACKGROUND: RGBColor = RGBColor(30, 30, 36);

/// Just enough of a terminal for indicatif's redraws: printable text, CR, LF, SGR
/// colours, erase-line and cursor-up.
struct Screen {
    lines: Vec<Vec<Cell>>,
    row: usize,
    col: usize,
    color: RGBColor,
}

impl Screen {
    fn new() -> Screen {
        Screen { lines: vec![Vec::new()], row: 0, col: 0, color: FOREGROUND }
    }

    fn put(&mut self, ch: char) {
        while self.lines.len() <= self.row {
            self.lines.push(Vec::new());
        }
        let line = &mut self.lines[self.row];
        while line.len() <= self.col {
            line.push(Cell { ch: ' ', color: FOREGROUND });
        }
        line[self.col] = Cell { ch, color: self.color };
        self.col += 1;
    }

    fn escape(&mut self, params: &str, command: char) {
        let number = |default: usize| params.parse().unwrap_or(default);
        match command {
            'm' => {
                for code in params.split(';') {
                    self.color = match code {
                        "32" => RGBColor(120, 200, 120),
                        "34" => RGBColor(110, 140, 230),
                        "36" => RGBColor(90, 200, 210),
                        _ => FOREGROUND,
                    };
                }
            }
            'K' => {
                if let Some(line) = self.lines.get_mut(self.row) {
                    line.truncate(if number(0) == 2 { 0 } else { self.col });
                }
            }
            'A' => self.row = self.row.saturating_sub(number(1)),
            _ => {}
        }
    }

    /// The text of the bar's line, if it shows a position.
    fn position(&self) -> Option<(u64, u64)> {
        let text: String = self.lines.get(self.row)?.iter().map(|c| c.ch).collect();
        let field = text.split_whitespace().find(|w| w.contains('/'))?;
        let (done, total) = field.split_once('/')?;
        Some((done.parse().ok()?, total.parse().ok()?))
    }
}

/// Replays `capture` and returns the screen as it stood when the bar first passed
/// `fraction` of the way.
fn frame_at(capture: &str, fraction: f64) -> Vec<Vec<Cell>> {
    let mut screen = Screen::new();
    let mut chars = capture.chars().peekable();
    while let Some(ch) = chars.next() {
        match ch {
            '\r' => {
                if let Some((done, total)) = screen.position()
                    && total > 0
                    && done as f64 >= fraction * total as f64
                    && !screen.lines[screen.row].iter().all(|c| c.ch == ' ')
                {
                    return screen.lines;
                }
                screen.col = 0;
            }
            '\n' => {
                screen.row += 1;
                screen.col = 0;
            }
            '\x1b' if chars.peek() == Some(&'[') => {
                chars.next();
                let mut params = String::new();
                while let Some(&c) = chars.peek() {
                    chars.next();
                    if c.is_ascii_alphabetic() {
                        screen.escape(&params, c);
                        break;
                    }
                    params.push(c);
                }
            }
            c if !c.is_control() => screen.put(c),
            _ => {}
        }
    }
    screen.lines
}

pub(crate) fn run() -> Result<(), String> {
    crate::cargo(&["build", "--quiet", "-p", "ratebucket-cli"], &[])?;
    let dir = std::env::temp_dir().join(format!("ratebucket-screenshot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let capture_path = dir.join("typescript");
    let output = dir.join("batch.output.jsonl");
    let binary = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/debug/ratebucket");
    let command = format!(
        "stty cols {COLUMNS} rows 12; {} batch examples/batch.jsonl --sim -o {}",
        binary.display(),
        output.display()
    );
    let status = Command::new("script")
        .args(["-qfec", &command])
        .arg(&capture_path)
        .stdout(std::process::Stdio::null())
        .status()
        .map_err(|e| format!("could not run script(1) (util-linux): {e}"))?;
    if !status.success() {
        return Err(format!("the captured run failed ({status})"));
    }
    let capture = std::fs::read(&capture_path).map_err(|e| e.to_string())?;
    let capture = String::from_utf8_lossy(&capture);
    // script(1) opens with a line of its own.
    let capture = capture.split_once('\n').map_or(&*capture, |(_, rest)| rest);
    let lines: Vec<Vec<Cell>> =
        frame_at(capture, 0.6).into_iter().filter(|l| l.iter().any(|c| c.ch != ' ')).collect();
    let _ = std::fs::remove_dir_all(&dir);
    draw(&lines, Path::new("docs/batch-progress.png"))
}

fn draw(lines: &[Vec<Cell>], path: &Path) -> Result<(), String> {
    let font = FONTS
        .iter()
        .find_map(|p| std::fs::read(p).ok())
        .ok_or("no DejaVu Sans Mono font found: install fonts-dejavu-core")?;
    let font: &'static [u8] = Box::leak(font.into_boxed_slice());
    plotters::style::register_font("monospace", FontStyle::Normal, font)
        .map_err(|_| "the font could not be read".to_owned())?;
    let (cell_h, margin) = (20u32, 16u32);
    // The font's own advance, so cells and runs of text line up.
    let (hundred, _) =
        ("monospace", 15).into_font().box_size(&"0".repeat(100)).map_err(|e| format!("{e:?}"))?;
    let cell_w = hundred as f64 / 100.0;
    let width = (COLUMNS as f64 * cell_w) as u32 + 2 * margin;
    let height = lines.len() as u32 * cell_h + 2 * margin;
    let area = BitMapBackend::new(path, (width, height)).into_drawing_area();
    area.fill(&BACKGROUND).map_err(|e| e.to_string())?;
    for (row, line) in lines.iter().enumerate() {
        for (col, cell) in line.iter().enumerate() {
            let ch = match cell.ch {
                ' ' => continue,
                // The spinner's braille dots are not in the font.
                '\u{2800}'..='\u{28ff}' => '*',
                ch => ch,
            };
            let style = ("monospace", 15).into_font().color(&cell.color);
            let at = (
                margin as i32 + (col as f64 * cell_w) as i32,
                (margin + row as u32 * cell_h) as i32,
            );
            area.draw_text(&ch.to_string(), &style, at).map_err(|e| e.to_string())?;
        }
    }
    area.present().map_err(|e| e.to_string())?;
    eprintln!("wrote {}", path.display());
    Ok(())
}
