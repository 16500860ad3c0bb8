"""The chat page at `/` in a real headless Chromium (Debian's `chromium`, driven by playwright):
it asks for the API key, lists the model, streams an answer into the DOM, and its Stop button
aborts the request in the engine (KV usage back to 0, an "abort" finish counted).

A screenshot of the page with the stopped answer is saved to tests/artifacts/chat_page.png (or
$PAGEDLLM_TEST_ARTIFACTS/chat_page.png).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Page, sync_playwright
from server_harness import TINY_SERVER_ARGS, scrape, start_server, wait_idle

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
KEY = "chat-page-key"


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model_path):
    srv = start_server(tmp_path_factory, tiny_model_path,
                       [*TINY_SERVER_ARGS, "--api-key", KEY, "--served-model-name", "tiny",
                        "--metrics-vllm-compat",
                        # Room for an answer that outlasts the test's checks on a fast
                        # machine (the random tiny model's positions past 1024 are as good).
                        "--kv-cache-memory", "64MiB", "--max-model-len", "32k",
                        "--allow-long-max-model-len"],
                       name="chat_page")
    yield srv
    srv.stop()


def find_chromium() -> str:
    """$PAGEDLLM_CHROMIUM, else the first Chromium on PATH; a missing browser fails the test
    with what to install (not a skip: CI must run this test)."""
    found = os.environ.get("PAGEDLLM_CHROMIUM") or next(
        filter(None, map(shutil.which, CHROMIUM_NAMES)), None)
    if not found:
        pytest.fail(f"no Chromium on PATH (looked for {', '.join(CHROMIUM_NAMES)}): install "
                    "Debian's `chromium` package (.ci/run does) or set PAGEDLLM_CHROMIUM to "
                    "the browser's path", pytrace=False)
    return found


@pytest.fixture(scope="module")
def page():
    chromium = find_chromium()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
        try:
            yield browser.new_page(viewport={"width": 1100, "height": 700})
        finally:
            browser.close()


def _artifact(name: str) -> Path:
    root = Path(os.environ.get("PAGEDLLM_TEST_ARTIFACTS")
                or Path(__file__).resolve().parents[1] / "artifacts")
    root.mkdir(parents=True, exist_ok=True)
    return root / name


def _metric(base_url: str, name: str) -> float:
    return scrape(base_url).get(name, 0.0)


def test_page_is_static_and_self_contained(server):
    html = httpx.get(f"{server.base_url}/", timeout=5).text  # no key needed for the page
    assert '<script src="/static/chat.js">' in html
    for asset in ("chat.js", "chat.css"):
        r = httpx.get(f"{server.base_url}/static/{asset}", timeout=5)
        assert r.status_code == 200
        assert "http://" not in r.text and "https://" not in r.text  # nothing from a CDN
    icon = httpx.get(f"{server.base_url}/favicon.ico", timeout=5)  # every browser asks
    assert icon.status_code == 200 and icon.headers["content-type"] == "image/svg+xml"
    assert icon.text.startswith("<svg") and 'rel="icon" href="/favicon.ico"' in html


def test_chat_streams_and_stop_aborts(server, page: Page):
    base = server.base_url
    page.goto(f"{base}/")
    # The server has --api-key: the page asks for it before it can list models.
    page.wait_for_selector("#keybox:not([hidden])", timeout=15_000)
    page.fill("#apikey", KEY)
    page.click("#savekey")
    page.wait_for_function("document.querySelector('#model').options.length > 0",
                           timeout=15_000)
    assert page.eval_on_selector_all("#model option", "os => os.map(o => o.value)") == ["tiny"]
    assert page.is_hidden("#keybox")

    sent: list[dict] = []

    def keep_going(route):  # a random tiny model may pick EOS early: make the answer long
        body = json.loads(route.request.post_data or "{}")
        body["ignore_eos"] = True
        sent.append(body)
        route.continue_(post_data=json.dumps(body))

    page.route("**/v1/chat/completions", keep_going)
    page.fill("#system", "You are terse.")
    page.fill("#max_tokens", "30000")
    page.fill("#temperature", "0")
    aborts_before = _metric(base, 'pagedllm:request_success_total{finished_reason="abort"}')
    page.fill("#input", "Hello there")
    page.press("#input", "Enter")

    # Streamed: the answer grows in the DOM while the request is still running.
    page.wait_for_function(
        "document.querySelector('.msg.assistant').textContent.length > 0", timeout=60_000)
    first = page.text_content(".msg.assistant")
    page.wait_for_function(
        f"document.querySelector('.msg.assistant').textContent.length > {len(first)}",
        timeout=60_000)
    assert page.get_attribute(".msg.assistant", "data-done") is None  # still streaming
    assert page.is_enabled("#stop")
    page.wait_for_function("document.querySelector('#speed').textContent.includes('tokens/s')")
    assert _metric(base, "pagedllm:kv_cache_usage_perc") > 0

    page.click("#stop")
    page.wait_for_selector(".msg.assistant[data-done='true']", timeout=15_000)
    page.screenshot(path=str(_artifact("chat_page.png")))  # (slow under load: after Stop)
    assert page.get_attribute(".msg.assistant", "data-stopped") == "true"
    assert "(stopped)" in page.text_content("#speed")
    idle = wait_idle(base)
    assert idle["pagedllm:kv_cache_usage_perc"] == 0
    assert idle["pagedllm:num_requests_running"] == 0
    assert idle['pagedllm:request_success_total{finished_reason="abort"}'] == aborts_before + 1
    assert idle['pagedllm:request_success_total{finished_reason="length"}'] == 0

    # What the page sent: the system prompt, the user's message, its sampling controls.
    body = sent[0]
    assert body["model"] == "tiny" and body["stream"] is True
    assert body["messages"] == [{"role": "system", "content": "You are terse."},
                                {"role": "user", "content": "Hello there"}]
    assert body["max_tokens"] == 30000 and body["temperature"] == 0
    assert page.is_enabled("#send") and page.is_disabled("#stop")


def test_one_token_answer_says_1_token(server, page: Page):
    """After the streaming test (same page, key saved): an answer of max_tokens 1."""
    page.fill("#max_tokens", "1")
    page.fill("#input", "Hi")
    page.press("#input", "Enter")
    page.wait_for_selector(".msg.assistant:last-of-type[data-done='true']", timeout=30_000)
    speed = page.text_content("#speed")
    assert speed.startswith("1 token, "), speed


def test_server_log_says_what_start_up_did(server):
    """Each load step with its time, the kernels, the warm-up before /health, and (no
    --disable-log-requests here) one line per accepted request."""
    log = server.log()
    for step in ("checkpoint (config, tokenizer)", "CPU kernels", "weights", "KV pool",
                 "warm-up forward pass"):
        assert f"start-up: {step} " in log, step
    assert "start-up: engine ready in" in log
    assert "CPU kernels loaded from cache" in log or "CPU kernels built in" in log
    assert log.index("warm-up forward pass") < log.index("Application startup complete")
    assert "request chatcmpl-" in log


def test_live_metrics_parse_with_every_documented_series(server):
    """A real server's /metrics, parsed by prometheus_client: every series in the README's
    table, and (--metrics-vllm-compat) the vLLM names too."""
    from prometheus_client.parser import text_string_to_metric_families
    from test_metrics_exposition import documented

    from pagedllm.engine.metrics import SERIES, VLLM_ALIASES

    text = httpx.get(f"{server.base_url}/metrics", timeout=5).text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    names = {s.name for f in families.values() for s in f.samples}
    for series, (kind, _) in documented().items():
        family = series.removesuffix("_total") if kind == "counter" else series
        assert families[family].type == kind, series
        assert any(n == series or n.startswith(series + "_") for n in names), series
    for aliases in VLLM_ALIASES.values():
        for alias in aliases:
            assert any(n == alias or n.startswith(alias + "_") for n in names), alias
    assert set(SERIES) == set(documented())
