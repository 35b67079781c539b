//! Hugging Face chat templates rendered with minijinja.
//!
//! transformers renders templates with Jinja2 (`trim_blocks`, `lstrip_blocks`, loop controls)
//! and adds `raise_exception` and `strftime_now`; templates call Python string and dict methods
//! (`.strip()`, `.startswith()`, `.items()`), which `minijinja-contrib`'s pycompat supplies.

use std::time::{SystemTime, UNIX_EPOCH};

use minijinja::{Environment, Error, ErrorKind, Value};
use serde_json::Value as Json;

use super::error::ModelError;

const TEMPLATE_NAME: &str = "chat_template";

/// Special-token strings a template may refer to (`bos_token`, `eos_token`, ...).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpecialTokens {
    /// `bos_token` of `tokenizer_config.json`.
    pub bos: Option<String>,
    /// `eos_token`.
    pub eos: Option<String>,
    /// `pad_token`.
    pub pad: Option<String>,
    /// `unk_token`.
    pub unk: Option<String>,
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    special: SpecialTokens,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source_len", &self.source.len())
            .field("special", &self.special)
            .finish_non_exhaustive()
    }
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

fn strftime_now(format: String) -> Result<Value, Error> {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    strftime_utc(&format, secs).map(Value::from)
}

/// `(year, month 1..=12, day 1..=31)` of a day count since 1970-01-01 (Howard Hinnant's
/// `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = [
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
];

/// A UTC `strftime` covering the specifiers chat templates use (Llama 3.x: `"%d %b %Y"`).
/// The daemon has no time zone configuration, so UTC is the honest choice.
pub(crate) fn strftime_utc(format: &str, unix_secs: u64) -> Result<String, Error> {
    let days = (unix_secs / 86_400) as i64;
    let secs_of_day = unix_secs % 86_400;
    let (year, month, day) = civil_from_days(days);
    let (hour, minute, second) = (secs_of_day / 3600, secs_of_day / 60 % 60, secs_of_day % 60);
    let month_name = MONTHS[(month - 1) as usize];
    let weekday = WEEKDAYS[days.rem_euclid(7) as usize];
    let day_of_year = days - {
        // Days from the epoch to January 1st of `year`.
        let y = year - 1;
        365 * (y - 1969) + (y / 4 - 1969 / 4) - (y / 100 - 1969 / 100) + (y / 400 - 1969 / 400)
    } + 1;
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&format!("{:02}", year.rem_euclid(100))),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('e') => out.push_str(&format!("{day:>2}")),
            Some('-') => match chars.next() {
                // glibc's "no padding" flag, used by some templates ("%-d").
                Some('d') => out.push_str(&day.to_string()),
                Some('m') => out.push_str(&month.to_string()),
                other => {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        format!(
                            "strftime_now: unsupported specifier %-{}",
                            other.unwrap_or(' ')
                        ),
                    ));
                }
            },
            Some('B') => out.push_str(month_name),
            Some('b') | Some('h') => out.push_str(&month_name[..3]),
            Some('A') => out.push_str(weekday),
            Some('a') => out.push_str(&weekday[..3]),
            Some('H') => out.push_str(&format!("{hour:02}")),
            Some('I') => out.push_str(&format!("{:02}", (hour + 11) % 12 + 1)),
            Some('p') => out.push_str(if hour < 12 { "AM" } else { "PM" }),
            Some('M') => out.push_str(&format!("{minute:02}")),
            Some('S') => out.push_str(&format!("{second:02}")),
            Some('j') => out.push_str(&format!("{day_of_year:03}")),
            Some('%') => out.push('%'),
            other => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!(
                        "strftime_now: unsupported specifier %{}",
                        other.unwrap_or(' ')
                    ),
                ));
            }
        }
    }
    Ok(out)
}

fn template_error(e: &Error) -> ModelError {
    // minijinja's Display omits the cause chain and location details that `{:#}` shows.
    ModelError::ChatTemplate(format!("{e:#}"))
}

/// Check the messages array: `[{"role": string, "content": string | null | array, ...}, ...]`.
fn validate_messages(messages: &Json) -> Result<(), ModelError> {
    let Some(list) = messages.as_array() else {
        return Err(ModelError::ChatTemplate(
            "messages must be a JSON array of {\"role\", \"content\"} objects".into(),
        ));
    };
    if list.is_empty() {
        return Err(ModelError::ChatTemplate("messages is empty".into()));
    }
    for (i, message) in list.iter().enumerate() {
        let Some(obj) = message.as_object() else {
            return Err(ModelError::ChatTemplate(format!(
                "message {i} is not an object"
            )));
        };
        if !obj.get("role").is_some_and(Json::is_string) {
            return Err(ModelError::ChatTemplate(format!(
                "message {i} has no string \"role\""
            )));
        }
        match obj.get("content") {
            None | Some(Json::Null) | Some(Json::String(_)) | Some(Json::Array(_)) => {}
            Some(_) => {
                return Err(ModelError::ChatTemplate(format!(
                    "message {i}: \"content\" must be a string, an array of parts or null"
                )));
            }
        }
    }
    Ok(())
}

impl ChatTemplate {
    /// Compile `source` (a Jinja template as found in `tokenizer_config.json`).
    pub fn new(source: impl Into<String>, special: SpecialTokens) -> Result<Self, ModelError> {
        let source = source.into();
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned(TEMPLATE_NAME, source.clone())
            .map_err(|e| template_error(&e))?;
        Ok(ChatTemplate {
            env,
            source,
            special,
        })
    }

    /// The template text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Render a JSON array of `{"role", "content"}` messages. `add_generation_prompt` appends
    /// the assistant header so the model continues as the assistant.
    pub fn render(
        &self,
        messages_json: &str,
        add_generation_prompt: bool,
    ) -> Result<String, ModelError> {
        let messages: Json = serde_json::from_str(messages_json)
            .map_err(|e| ModelError::ChatTemplate(format!("messages are not valid JSON: {e}")))?;
        self.render_value(&messages, add_generation_prompt)
    }

    /// [`ChatTemplate::render`] for already parsed messages.
    pub fn render_value(
        &self,
        messages: &Json,
        add_generation_prompt: bool,
    ) -> Result<String, ModelError> {
        validate_messages(messages)?;
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| template_error(&e))?;
        let opt = |s: &Option<String>| s.as_deref().map(Value::from).unwrap_or(Value::UNDEFINED);
        let ctx = minijinja::context! {
            messages => Value::from_serialize(messages),
            add_generation_prompt => add_generation_prompt,
            bos_token => opt(&self.special.bos),
            eos_token => opt(&self.special.eos),
            pad_token => opt(&self.special.pad),
            unk_token => opt(&self.special.unk),
        };
        template.render(ctx).map_err(|e| template_error(&e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strftime_known_dates() {
        // 2024-07-23 14:05:09 UTC (a Tuesday, day 205).
        let t = 1_721_743_509;
        assert_eq!(strftime_utc("%d %b %Y", t).unwrap(), "23 Jul 2024");
        assert_eq!(
            strftime_utc("%A %B %-d %H:%M:%S %j %y %p %I", t).unwrap(),
            "Tuesday July 23 14:05:09 205 24 PM 02"
        );
        // The epoch and a leap day.
        assert_eq!(strftime_utc("%Y-%m-%d %a", 0).unwrap(), "1970-01-01 Thu");
        assert_eq!(
            strftime_utc("%Y-%m-%d %j", 951_782_400).unwrap(),
            "2000-02-29 060"
        );
        assert!(strftime_utc("%Q", 0).is_err());
    }
}
