"""Tests of scripts/deploy/metric_names.py: the check must be able to fail."""

import unittest

import metric_names

SCRAPE = {
    "handoff_dead_letters_total": [{"code": "malformed"}, {"code": "too_large"}],
    "handoff_fenced": [{}],
    "handoff_latency_seconds_bucket": [{"le": "0.1"}],
}


class MetricNames(unittest.TestCase):
    def test_names_skip_functions_labels_and_durations(self):
        expr = ('histogram_quantile(0.99, sum by (le) (rate('
                'handoff_latency_seconds_bucket{instance=~"$instance"}[5m]))) > 0.05')
        self.assertEqual(metric_names.names(expr), {"handoff_latency_seconds_bucket"})
        self.assertEqual(metric_names.names("(count(handoff_fenced == 0) or vector(0)) == 0"),
                         {"handoff_fenced"})
        self.assertEqual(metric_names.names("label_values(handoff_fenced, instance)"),
                         {"handoff_fenced"})

    def test_an_exported_metric_and_label_value_pass(self):
        expr = 'sum by (code) (rate(handoff_dead_letters_total{code="malformed"}[5m])) > 0'
        self.assertEqual(metric_names.problems(expr, "x", SCRAPE), [])

    def test_a_metric_the_worker_does_not_export_fails(self):
        found = metric_names.problems("rate(handoff_cancels_evicted_total[5m]) > 0 or up == 0",
                                      "x", SCRAPE)
        self.assertEqual(len(found), 2, found)
        self.assertIn("handoff_cancels_evicted_total", found[0] + found[1])

    def test_a_label_value_the_worker_does_not_export_fails(self):
        found = metric_names.problems('rate(handoff_dead_letters_total{code="malformd"}[5m])',
                                      "x", SCRAPE)
        self.assertEqual(found, ['x: no handoff_dead_letters_total series has code="malformd"'])


if __name__ == "__main__":
    unittest.main()
