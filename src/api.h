/* api.h — `ditto serve`: an OpenAI-compatible HTTP server on the scheduler.
 *
 *   POST /v1/chat/completions   POST /v1/completions   (stream true/false, SSE)
 *   GET  /v1/models  /v1/models/{id}   GET /health   GET /metrics   GET /slots
 *
 * The HTTP listener starts before the model loads (/health answers 503 until the
 * engine is ready). One scheduler thread runs the engine; each connection has its
 * own thread, and talks to the scheduler only through sched.h's thread-safe calls. */
#ifndef DITTO_API_H
#define DITTO_API_H

/* `ditto serve [-m FILE] [--host H] [--port P] [--streams N] [--ctx N] [--threads N]
 * [--max-queue N] [--prefill-chunk N] [--api-key KEY | --api-key-file F] [--unify]
 * [--grace S] [--quiet]`; argv[0] is "serve". Runs until SIGINT/SIGTERM; returns the
 * exit status (0 after a clean shutdown, 1 on a boot failure, 2 on bad usage). */
int api_serve_cmd(int argc, char **argv);

#endif
