"""Streams: one streamed completion from its first engine event to ``[DONE]``, continued on another replica when
its engine fails mid-way and the pool resumes streams (``pools[].resumeStreams``).

Once the first event went out the client holds 200 headers, so nothing is retried as such. On a failure (the
connection broke, the engine closed the stream early or sent an engine error event, the total timeout passed):

* the engine is accounted as failed as before (outlier ejection) and leaves rotation until its next good probe;
* without resuming (pool setting off, a request that cannot be continued, see `gateway.resume`) the stream ends
  with an SSE error event and ``[DONE]``, recorded as status 502;
* with resuming, the generation goes on where it stopped on the first replica to be ready (the restarted engine
  included), waited for up to ``timeouts.firstTokenS``, while ``retries.maxAttempts`` (all attempts of the
  request together) and the retry budget allow: a stream's first resume is its own (an engine death breaks every
  stream on it at once, far more than any retry reserve), later ones are retries (`RetryBudget.try_resume`).
  When no resume succeeds the stream ends with the error event as above.

``timeouts.totalS`` bounds the whole stream, resumes included. The quota is settled once, when the stream ends,
with the usage of all parts together. The session owns the Outcome's answer part for a stream (first token,
tokens, the error and status of a stream that failed after its 200 headers, resumes).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable

from aiohttp import web

from gateway.call import Call
from gateway.continuation import continuation
from gateway.dialects import stream_ends, stream_error
from gateway.errors import UpstreamBroken, UpstreamError
from gateway.proxy import CONNECTION_BROKEN, SseRelay
from gateway.resume import Transcript
from gateway.routing.base import EndpointView
from gateway.tracing import fail
from gateway.upstream import Attempt, Upstream

BROKEN_STREAM_STATUS = 502  # what the metrics and the access log record for a stream that failed mid-way

__all__ = ["Segment", "StreamSession"]

log = logging.getLogger("llmfleet.gateway")


@dataclasses.dataclass
class Segment:
    """One engine's part of a stream: its attempt (the lease on the replica), its relay, the bytes to send first."""

    attempt: Attempt
    relay: SseRelay
    first: bytes
    offset: int = 0  # tokens the client had before this part began (sent back to the engine as its prompt)

    def close(self) -> None:
        self.relay.resp.close()
        self.attempt.close()


class StreamSession:
    """The relay of one stream: `run` owns the first segment from its first event on."""

    def __init__(self, call: Call, upstream: Upstream, rewrite: Callable[[bytes], bytes] | None = None) -> None:
        """``rewrite`` changes each chunk of events before it goes out (a Responses stream's ids)."""
        self.call, self.upstream, self.rewrite = call, upstream, rewrite
        self.transcript = Transcript.for_request(call.parsed) if call.pool.resume_streams else None
        self.resuming = False  # a failure met a stream that can be continued: counted in resumed_streams_total
        # What the first engine gets: a stream that may be resumed asks for its token ids (`gateway.resume`).
        self.body = call.body if self.transcript is None else self.transcript.request_body(call.body)

    async def run(self, segment: Segment, deadline: float) -> web.StreamResponse:
        """Relay ``segment`` and any resumed ones until ``[DONE]`` or a failure that is not resumed."""
        up, out, spans = self.upstream, self.call.out, self.call.spans
        response = web.StreamResponse(
            status=200,
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                "x-request-id": out.request_id,
                "x-llmfleet-replica": segment.attempt.ep.id,
            },
        )
        streaming = spans.begin("streaming", {"llmfleet.replica": segment.attempt.ep.id})
        try:
            await response.prepare(self.call.request)
            failure = await self._write(response, segment.first)
            out.first_token_s = up.clock.monotonic() - out.received
            while True:
                if failure is None:
                    failure = await self._pump(response, segment, deadline)
                if failure is None:
                    self._ended(segment)
                    break
                up.account(segment.attempt.ep, UpstreamBroken(failure))
                resumed = await self._resume(segment, failure, deadline)
                if resumed is None:
                    out.error, out.stream_status = "stream_broken", BROKEN_STREAM_STATUS
                    await response.write(stream_error(self.call.parsed.kind, failure))
                    break
                segment = resumed
                failure = await self._write(response, segment.first)
            await response.write_eof()
        except BaseException as exc:  # the client went away, or the relay itself failed
            fail(streaming, exc)
            raise
        finally:
            segment.close()
            self._settle(segment)
            attributes = {"gen_ai.usage.output_tokens": out.completion_tokens, "llmfleet.resumes": out.resumes}
            spans.end(streaming, out.error, attributes)
        return response

    def _ended(self, segment: Segment) -> None:
        """The engine ended the stream with ``[DONE]``; after an error event of its own, the request failed."""
        up, out, code = self.upstream, self.call.out, segment.relay.error_code
        if code is None:
            up.succeeded(segment.attempt.ep)
        elif code < 500:  # the engine refused the client's request: the replica is fine
            up.succeeded(segment.attempt.ep)
            out.error, out.stream_status = "engine_error_event", code
        else:
            up.account(segment.attempt.ep, UpstreamBroken(f"the engine sent an error event ({code})"))
            out.error, out.stream_status = "engine_error_event", BROKEN_STREAM_STATUS

    async def _write(self, response: web.StreamResponse, chunk: bytes) -> str | None:
        """Send complete events on (through the transcript when resuming); the failure found in them, if any."""
        failure = None
        if self.transcript is not None:
            chunk, failure = self.transcript.relay(chunk)
        if self.rewrite is not None:
            chunk = self.rewrite(chunk)
        if chunk:
            await response.write(chunk)
        return failure

    async def _pump(self, response: web.StreamResponse, segment: Segment, deadline: float) -> str | None:
        """Relay the rest of ``segment``; None when it ended with ``[DONE]``, else what went wrong."""
        relay = segment.relay
        try:
            async with asyncio.timeout_at(deadline):
                while True:
                    data = await relay.resp.content.readany()
                    if not data:
                        break
                    chunk = relay.feed(data)
                    if chunk:
                        failure = await self._write(response, chunk)
                        if failure is not None:
                            return failure
        except TimeoutError:
            return f"stream exceeded the total timeout of {self.upstream.timeouts.total_s:g}s"
        except CONNECTION_BROKEN as exc:
            return f"the engine connection broke mid-stream ({type(exc).__name__})"
        done = relay.done if self.transcript is None else self.transcript.done
        return None if done else "the engine closed the stream before it finished"

    async def _resume(self, broken: Segment, failure: str, deadline: float) -> Segment | None:
        """The next segment of the stream on a ready replica, or None (not resumable, no replica, out of attempts)."""
        call, transcript = self.call, self.transcript
        if transcript is None:
            return None
        continued = continuation(call.parsed, self.body, transcript)
        if continued is None:
            return None
        path = continued.path or call.path
        up, out = self.upstream, call.out
        self.resuming = True
        broken.close()
        up.take_out(broken.attempt.ep)  # until its next good probe: the resume goes elsewhere
        until = min(deadline, asyncio.get_running_loop().time() + up.timeouts.first_token_s)
        while up.may_resume(out):
            view = await self._ready_replica(until)
            if view is None:
                log.warning("%s: no replica became ready to resume on within the timeout", out.request_id)
                return None
            out.resumes += 1
            attempt = up.begin(view, call.pool, out)
            ep = attempt.ep
            try:
                with call.spans.upstream(ep.id, call.pool.name, ep.url, out.attempts, "resume") as span:
                    headers = call.spans.headers_for(span, call.headers)
                    hide = not call.parsed.client_wants_usage
                    relay, first = await up.open(ep, path, continued.body, headers, hide, stream_ends(call.parsed.kind))
            except UpstreamError as exc:
                attempt.close()
                up.account(ep, exc)
                log.warning("%s: resuming on %s failed: %s", out.request_id, ep.id, exc)
                if exc.retryable:  # refused or gone before its first event: another replica may take it
                    continue
                return None
            except BaseException:
                attempt.close()
                raise
            by = "token ids" if continued.keeps_ids else "text"
            log.info("%s: resumed on %s after %d tokens by %s (%s)", out.request_id, ep.id, continued.sent, by, failure)
            transcript.begin_resumed_part(continued)
            return Segment(attempt, relay, first, offset=continued.sent)
        log.warning("%s: not resumed: out of attempts or retry budget", out.request_id)
        return None

    async def _ready_replica(self, until: float) -> EndpointView | None:
        """The router's pick among ready replicas, waiting for one to become ready until ``until`` (loop time)."""
        up, pool, loop = self.upstream, self.call.pool.name, asyncio.get_running_loop()
        while True:
            decision = up.route(pool, dataclasses.replace(self.call.info, now=up.clock.monotonic()), ready_only=True)
            if decision is not None:
                return decision.endpoint
            remaining = until - loop.time()
            if remaining <= 0:
                return None
            await up.wait_for_change(pool, remaining)

    def _settle(self, segment: Segment) -> None:
        """Usage of the whole stream for the quota, the metrics and the access log."""
        out, usage = self.call.out, segment.relay.usage
        if usage.completion_tokens is not None:
            # The last engine counted the text sent back to it as prompt; it was completion.
            out.completion_tokens = usage.completion_tokens + segment.offset
            out.prompt_tokens = None if usage.prompt_tokens is None else max(0, usage.prompt_tokens - segment.offset)
        elif self.transcript is not None:
            out.completion_tokens = self.transcript.tokens
        else:  # broken stream: each relayed event carried about one token
            out.completion_tokens = segment.relay.events
        out.used_tokens = self.call.used_tokens()
        if self.resuming:
            metrics = self.upstream.metrics
            metrics.child(metrics.resumed_streams, out.model, "failed" if out.error else "completed").inc()
