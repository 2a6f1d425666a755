//! The message mix: which kinds of prefill result a run sends, in what
//! proportion, and what output each kind must produce (contract 4.2).

use std::fmt;
use std::str::FromStr;

/// One kind of synthetic prefill result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A TensorRT-LLM context-only result that needs decode, with the
    /// `disagg_request_id` its context phase ran with (kept by the worker).
    Trtllm,
    /// An SGLang result with bootstrap parameters.
    Sglang,
    /// A vLLM result with KV-transfer parameters.
    Vllm,
    /// A result with handoff parameters of no known backend.
    Opaque,
    /// A prefill that already finished (stop, eos, cancelled, abort).
    Terminal,
    /// A result the worker must answer with an error response: alternately a
    /// TensorRT-LLM handoff without `ctx_request_id` and a prefill error frame.
    Error,
    /// A result whose `reply_to` is not allowed: it must be dead-lettered.
    Dead,
    /// A TensorRT-LLM handoff whose request is cancelled (on the cancel
    /// subject, before the run): the worker answers error `cancelled`.
    Cancelled,
}

impl Kind {
    pub const ALL: [Kind; 8] = [
        Kind::Trtllm,
        Kind::Sglang,
        Kind::Vllm,
        Kind::Opaque,
        Kind::Terminal,
        Kind::Error,
        Kind::Dead,
        Kind::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Trtllm => "trtllm",
            Kind::Sglang => "sglang",
            Kind::Vllm => "vllm",
            Kind::Opaque => "opaque",
            Kind::Terminal => "terminal",
            Kind::Error => "error",
            Kind::Dead => "dead",
            Kind::Cancelled => "cancelled",
        }
    }

    /// The output the worker must publish for this kind.
    pub fn expected(self) -> OutputKind {
        match self {
            Kind::Trtllm | Kind::Sglang | Kind::Vllm | Kind::Opaque => OutputKind::Decode,
            Kind::Terminal => OutputKind::Terminal,
            Kind::Error | Kind::Cancelled => OutputKind::Error,
            Kind::Dead => OutputKind::DeadLetter,
        }
    }
}

/// What kind of output arrived (or was expected) for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OutputKind {
    /// A decode job on the GEN subject.
    Decode,
    /// A terminal response on the reply subject.
    Terminal,
    /// An error response on the reply subject.
    Error,
    /// The original bytes on the dead-letter subject.
    DeadLetter,
    /// The input bytes unchanged on the GEN subject (a raw relay baseline).
    Relayed,
    /// Something with a request ID of this run that fits none of the above.
    Unrecognized,
}

impl OutputKind {
    pub const ALL: [OutputKind; 6] = [
        OutputKind::Decode,
        OutputKind::Terminal,
        OutputKind::Error,
        OutputKind::DeadLetter,
        OutputKind::Relayed,
        OutputKind::Unrecognized,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            OutputKind::Decode => "decode",
            OutputKind::Terminal => "terminal",
            OutputKind::Error => "error",
            OutputKind::DeadLetter => "dead_letter",
            OutputKind::Relayed => "relayed",
            OutputKind::Unrecognized => "unrecognized",
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }
}

/// Weights per kind, e.g. `trtllm=80,terminal=15,error=5`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mix {
    weights: Vec<(Kind, u32)>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--mix {input:?}: {why}")]
pub struct MixError {
    input: String,
    why: String,
}

impl Default for Mix {
    fn default() -> Self {
        Mix {
            weights: vec![(Kind::Trtllm, 80), (Kind::Terminal, 15), (Kind::Error, 5)],
        }
    }
}

impl FromStr for Mix {
    type Err = MixError;

    fn from_str(input: &str) -> Result<Mix, MixError> {
        let fail = |why: String| MixError {
            input: input.to_string(),
            why,
        };
        let mut weights: Vec<(Kind, u32)> = Vec::new();
        for part in input.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, weight) = part
                .split_once('=')
                .ok_or_else(|| fail(format!("{part:?} is not KIND=WEIGHT")))?;
            let kind = Kind::ALL
                .into_iter()
                .find(|k| k.as_str() == name.trim())
                .ok_or_else(|| {
                    let known: Vec<&str> = Kind::ALL.iter().map(|k| k.as_str()).collect();
                    fail(format!(
                        "unknown kind {:?}; expected one of {}",
                        name.trim(),
                        known.join(", ")
                    ))
                })?;
            let weight: u32 = weight.trim().parse().map_err(|_| {
                fail(format!(
                    "weight {:?} of {} is not a whole number",
                    weight.trim(),
                    kind.as_str()
                ))
            })?;
            if weights.iter().any(|(k, _)| *k == kind) {
                return Err(fail(format!("{} is given twice", kind.as_str())));
            }
            weights.push((kind, weight));
        }
        weights.retain(|(_, w)| *w > 0);
        if weights.is_empty() {
            return Err(fail("no kind has a weight above 0".into()));
        }
        if weights.iter().map(|(_, w)| u64::from(*w)).sum::<u64>() > u64::from(u32::MAX) {
            return Err(fail("the weights add up to more than 2^32 - 1".into()));
        }
        Ok(Mix { weights })
    }
}

impl fmt::Display for Mix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self
            .weights
            .iter()
            .map(|(k, w)| format!("{}={w}", k.as_str()))
            .collect();
        f.write_str(&parts.join(","))
    }
}

impl Mix {
    /// The kinds of `n` messages, interleaved as evenly as the weights allow
    /// (smooth weighted round-robin): every prefix of the schedule is close to
    /// the mix, so a short or interrupted run still sends the intended blend.
    pub fn schedule(&self, n: usize) -> Vec<Kind> {
        let total: i64 = self.weights.iter().map(|(_, w)| i64::from(*w)).sum();
        let mut current = vec![0i64; self.weights.len()];
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let mut best = 0;
            for (i, (_, w)) in self.weights.iter().enumerate() {
                current[i] += i64::from(*w);
                if current[i] > current[best] {
                    best = i;
                }
            }
            current[best] -= total;
            out.push(self.weights[best].0);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_rejects() {
        let cases: &[(&str, Result<&str, &str>)] = &[
            (
                "trtllm=80,terminal=15,error=5",
                Ok("trtllm=80,terminal=15,error=5"),
            ),
            (" vllm = 1 , dead=0, sglang=2 ", Ok("vllm=1,sglang=2")),
            ("opaque=3", Ok("opaque=3")),
            ("trtllm", Err("is not KIND=WEIGHT")),
            ("gpt=5", Err("unknown kind \"gpt\"")),
            ("trtllm=-1", Err("is not a whole number")),
            ("trtllm=1.5", Err("is not a whole number")),
            ("trtllm=1,trtllm=2", Err("given twice")),
            ("trtllm=0", Err("no kind has a weight")),
            ("", Err("no kind has a weight")),
            ("trtllm=4294967295,error=1", Err("more than 2^32")),
        ];
        for (input, want) in cases {
            let got = input.parse::<Mix>();
            match (want, got) {
                (Ok(canon), Ok(mix)) => assert_eq!(mix.to_string(), *canon, "{input}"),
                (Err(needle), Err(e)) => {
                    assert!(e.to_string().contains(needle), "{input}: {e}")
                }
                (want, got) => panic!("{input}: want {want:?}, got {got:?}"),
            }
        }
    }

    #[test]
    fn schedule_follows_the_weights_in_every_window() {
        let mix = Mix::default();
        let kinds = mix.schedule(1000);
        let count = |slice: &[Kind], k: Kind| slice.iter().filter(|x| **x == k).count();
        assert_eq!(count(&kinds, Kind::Trtllm), 800);
        assert_eq!(count(&kinds, Kind::Terminal), 150);
        assert_eq!(count(&kinds, Kind::Error), 50);
        // Interleaved, not in blocks: every 20 consecutive messages hold one error.
        for window in kinds.chunks(20) {
            assert_eq!(count(window, Kind::Error), 1);
            assert_eq!(count(window, Kind::Terminal), 3);
        }
    }

    #[test]
    fn expected_outputs() {
        let table = [
            (Kind::Trtllm, OutputKind::Decode),
            (Kind::Sglang, OutputKind::Decode),
            (Kind::Vllm, OutputKind::Decode),
            (Kind::Opaque, OutputKind::Decode),
            (Kind::Terminal, OutputKind::Terminal),
            (Kind::Error, OutputKind::Error),
            (Kind::Dead, OutputKind::DeadLetter),
        ];
        for (kind, want) in table {
            assert_eq!(kind.expected(), want, "{}", kind.as_str());
        }
    }
}
