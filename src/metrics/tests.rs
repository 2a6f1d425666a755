use super::*;
use std::collections::BTreeMap;

/// Every sample line (`name{labels} value`) of an exposition, by series.
fn samples(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_string(), value.parse().ok()?))
        })
        .collect()
}

#[test]
fn label_handles_are_indexed_by_discriminant() {
    for (i, v) in FinishReason::ALL.iter().enumerate() {
        assert_eq!(*v as usize, i, "{v:?}");
    }
    for (i, v) in ErrorCode::ALL.iter().enumerate() {
        assert_eq!(*v as usize, i, "{v:?}");
    }
    for (i, v) in DeadLetterCode::ALL.iter().enumerate() {
        assert_eq!(*v as usize, i, "{v:?}");
    }
    for (i, v) in Backend::ALL.iter().enumerate() {
        assert_eq!(*v as usize, i, "{v:?}");
    }
    for (i, v) in NakReason::ALL.iter().enumerate() {
        assert_eq!(*v as usize, i, "{v:?}");
    }
    for (i, v) in MintSource::ALL.iter().enumerate() {
        assert_eq!(*v as usize, i, "{v:?}");
    }
    for (i, v) in TraceHeader::ALL.iter().enumerate() {
        assert_eq!(*v as usize, i, "{v:?}");
    }
    for (i, v) in SpanDrop::ALL.iter().enumerate() {
        assert_eq!(*v as usize, i, "{v:?}");
    }
    for (i, v) in CancelEvent::ALL.iter().enumerate() {
        assert_eq!(*v as usize, i, "{v:?}");
    }
    let kinds = [
        Outcome::Decode {
            backend: Backend::Opaque,
            minted: false,
        },
        Outcome::Terminal {
            finish_reason: FinishReason::Eos,
        },
        Outcome::Error {
            code: ErrorCode::NoOutput,
        },
        Outcome::DeadLetter {
            code: DeadLetterCode::TooLarge,
        },
    ];
    for o in kinds {
        assert_eq!(OUTCOME_KINDS[outcome_index(&o)], o.kind());
    }
}

/// Every series of a counter with a label: one per value of the label.
fn labelled_series() -> Vec<String> {
    // (counter, label, every value of the label)
    let families: [(&str, &str, Vec<&str>); 12] = [
        ("outputs_total", "outcome", OUTCOME_KINDS.to_vec()),
        (
            "terminal_total",
            "finish_reason",
            FinishReason::ALL.map(FinishReason::as_str).to_vec(),
        ),
        (
            "error_responses_total",
            "code",
            ErrorCode::ALL.map(ErrorCode::as_str).to_vec(),
        ),
        (
            "dead_letters_total",
            "code",
            DeadLetterCode::ALL.map(DeadLetterCode::as_str).to_vec(),
        ),
        (
            "decode_jobs_total",
            "backend",
            Backend::ALL.map(Backend::as_str).to_vec(),
        ),
        (
            "ids_minted_total",
            "source",
            MintSource::ALL.map(MintSource::as_str).to_vec(),
        ),
        (
            "id_requests_total",
            "result",
            IdRequestResult::ALL.map(IdRequestResult::as_str).to_vec(),
        ),
        (
            "jetstream_naks_total",
            "reason",
            NakReason::ALL.map(NakReason::as_str).to_vec(),
        ),
        (
            "trace_headers_dropped_total",
            "header",
            TraceHeader::ALL.map(TraceHeader::as_str).to_vec(),
        ),
        (
            "otel_spans_dropped_total",
            "reason",
            SpanDrop::ALL.map(SpanDrop::as_str).to_vec(),
        ),
        (
            "cancels_total",
            "event",
            CancelEvent::ALL.map(CancelEvent::as_str).to_vec(),
        ),
        (
            "release_notices_total",
            "result",
            vec!["published", "failed"],
        ),
    ];
    families
        .into_iter()
        .flat_map(|(name, label, values)| {
            values
                .into_iter()
                .map(move |v| format!("handoff_{name}{{{label}=\"{v}\"}}"))
        })
        .collect()
}

#[test]
fn every_series_exists_at_zero_from_the_start() {
    let text = Metrics::new().encode();
    let s = samples(&text);
    let mut want = labelled_series();
    for name in [
        "cancels_held",
        "deadline_remaining_seconds_count",
        "otel_spans_exported_total",
        "trailing_frames_ignored_total",
        "lease_recoveries_total",
        "nats_reconnects_total",
        "publish_failures_total",
        "jetstream_redeliveries_total",
        "in_flight",
        "tasks",
        "latency_seconds_count",
        "latency_seconds_sum",
    ] {
        want.push(format!("handoff_{name}"));
    }
    for series in &want {
        assert_eq!(s.get(series), Some(&0.0), "{series} in\n{text}");
    }
    assert_eq!(s.get("handoff_fenced"), Some(&1.0));
    assert_eq!(s.get("handoff_machine_id"), Some(&-1.0));
    assert_eq!(
        s.get("handoff_latency_seconds_bucket{le=\"+Inf\"}"),
        Some(&0.0)
    );
    assert_eq!(
        s.get("handoff_latency_seconds_bucket{le=\"5e-05\"}"),
        Some(&0.0)
    );
    assert!(text.contains("# HELP handoff_outputs_total "), "{text}");
    assert!(
        text.contains("# TYPE handoff_latency_seconds histogram"),
        "{text}"
    );
}

#[test]
fn recording_moves_exactly_the_matching_series() {
    // (outcome, trailing frames, series that must move by one besides outputs)
    let cases = [
        (
            Outcome::Decode {
                backend: Backend::Trtllm,
                minted: true,
            },
            0,
            vec![
                "handoff_decode_jobs_total{backend=\"trtllm\"}",
                "handoff_ids_minted_total{source=\"decode_job\"}",
            ],
        ),
        (
            Outcome::Decode {
                backend: Backend::Vllm,
                minted: false,
            },
            2,
            vec!["handoff_decode_jobs_total{backend=\"vllm\"}"],
        ),
        (
            Outcome::Terminal {
                finish_reason: FinishReason::Other,
            },
            0,
            vec!["handoff_terminal_total{finish_reason=\"other\"}"],
        ),
        (
            Outcome::Error {
                code: ErrorCode::InvalidBootstrap,
            },
            0,
            vec!["handoff_error_responses_total{code=\"invalid_bootstrap\"}"],
        ),
        (
            Outcome::DeadLetter {
                code: DeadLetterCode::ReplyToNotAllowed,
            },
            0,
            vec!["handoff_dead_letters_total{code=\"reply_to_not_allowed\"}"],
        ),
    ];
    for (outcome, trailing, moved) in cases {
        let metrics = Metrics::new();
        let before = samples(&metrics.encode());
        metrics.record(&outcome, trailing, Duration::from_micros(300));
        let after = samples(&metrics.encode());
        let mut want = before.clone();
        let output = format!("handoff_outputs_total{{outcome=\"{}\"}}", outcome.kind());
        for series in moved.iter().map(|s| s.to_string()).chain([output]) {
            *want.get_mut(&series).unwrap_or_else(|| panic!("{series}")) += 1.0;
        }
        *want
            .get_mut("handoff_trailing_frames_ignored_total")
            .unwrap() += trailing as f64;
        *want.get_mut("handoff_latency_seconds_count").unwrap() += 1.0;
        *want.get_mut("handoff_latency_seconds_sum").unwrap() += 0.0003;
        for le in [
            "0.0005", "0.001", "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5",
            "1", "2.5", "5", "+Inf",
        ] {
            let series = format!("handoff_latency_seconds_bucket{{le=\"{le}\"}}");
            *want
                .get_mut(&series)
                .unwrap_or_else(|| panic!("{series} in {after:?}")) += 1.0;
        }
        for (series, value) in &want {
            let got = after.get(series).copied().unwrap_or(f64::NAN);
            assert!(
                (got - value).abs() < 1e-9,
                "{outcome:?}: {series} is {got}, want {value}"
            );
        }
    }
}

#[test]
fn events_off_the_hot_path() {
    let metrics = Metrics::new();
    metrics.nats_reconnected();
    metrics.publish_failed();
    metrics.publish_failed();
    metrics.nacked(NakReason::PublishFailed);
    metrics.redelivered();
    metrics.id_request(IdRequestResult::Ok, 5);
    metrics.id_request(IdRequestResult::NoReply, 0);
    metrics.set_identity(false, Some(42));
    let guard = metrics.in_flight();
    let _second = metrics.in_flight();
    drop(guard);
    let s = samples(&metrics.encode());
    let want = [
        ("handoff_nats_reconnects_total", 1.0),
        ("handoff_publish_failures_total", 2.0),
        (
            "handoff_jetstream_naks_total{reason=\"publish_failed\"}",
            1.0,
        ),
        ("handoff_jetstream_redeliveries_total", 1.0),
        ("handoff_id_requests_total{result=\"ok\"}", 1.0),
        ("handoff_id_requests_total{result=\"no_reply\"}", 1.0),
        ("handoff_ids_minted_total{source=\"id_service\"}", 5.0),
        ("handoff_ids_minted_total{source=\"decode_job\"}", 0.0),
        ("handoff_fenced", 0.0),
        ("handoff_machine_id", 42.0),
        ("handoff_in_flight", 1.0),
        ("handoff_outputs_total{outcome=\"decode\"}", 0.0),
    ];
    for (series, value) in want {
        assert_eq!(s.get(series), Some(&value), "{series}");
    }
}
