/* magic_sync: a replica for an app in any language.
 *
 * Made by cbindgen from crates/magic_sync_ffi/src/lib.rs: change that, not
 * this. Link with -lmagic_sync_ffi. */

#ifndef MAGIC_SYNC_H
#define MAGIC_SYNC_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

// What a call did. `MS_OK` is success; the next three are the kinds of
// failure the engine itself tells apart, and say what to do next.
typedef enum {
  // It went through.
  MS_OK = 0,
  // It failed on what may pass (the app held the file past the busy
  // timeout): the same call again, later, may go through.
  MS_RETRY = 1,
  // What it was about was left, and the rest goes on.
  MS_SET_ASIDE = 2,
  // Only the app's operator can end it (a key not trusted, a file that
  // cannot be written, a description it cannot follow): say it, and stop.
  MS_STOP = 3,
  // The handle is null, or was closed.
  MS_INVALID_HANDLE = 4,
  // An argument is null, not UTF-8, or not what it should be (a server
  // key that is no key, an address that is no `ws://` or `wss://`).
  MS_INVALID_ARGUMENT = 5,
  // The replica's loop runs: stop it first.
  MS_RUNNING = 6,
  // A bug in the library: a panic, caught at the boundary.
  MS_BUG = 7,
} ms_code;

// How far the app's writes up to a mark went.
typedef enum {
  // Some are on this replica only: not sent yet, or not filed yet.
  MS_WRITTEN_HERE = 0,
  // The server filed them all; what it did because of them has not all
  // come back yet.
  MS_WRITTEN_FILED = 1,
  // Filed, and everything the server did because of them applied here:
  // the app reads its own writes.
  MS_WRITTEN_REACHED = 2,
} ms_written;

// A replica, as the app holds it: opaque, a number in the library's
// table of open replicas.
typedef struct ms_replica ms_replica;

// Called on the replica's thread with the number of each message applied,
// and `context` as it was given. It must not block: the next message
// waits for it.
typedef void (*ms_on_applied)(void *context, uint64_t message);

#ifdef __cplusplus
extern "C" {
#endif // __cplusplus

// The words of the calling thread's last failure, or null after a call
// that went through. The library keeps them until this thread's next
// call: copy them to keep them.
const char *ms_last_error(void);

// Gives back a string the library handed out. Null is nothing to free.
//
// # Safety
//
// `s` is null, or a string this library handed out and not freed yet.
void ms_string_free(char *s);

// Opens (or creates) the replica `id` in the SQLite file at `path`, and
// hands back its handle in `out`. It holds no table until the server
// describes them; reopened, it follows the description it kept.
//
// # Safety
//
// `path` and `id` are NUL-terminated strings; `out` points at a handle
// the library may write.
ms_code ms_replica_open(const char *path, const char *id, ms_replica **out);

// Pins `server_key`, the server's key as it was handed over with the
// replica's secret (`magic-sync key` prints it): from then on the replica
// applies only what that key, or a newer key it endorsed, signed. A
// replica that pinned a key takes that key again, and refuses another
// (`MS_STOP`, naming both). [`ms_replica_run`] pins the key it is given
// too; this pins it before a run (`MS_RUNNING` while one runs).
//
// # Safety
//
// `r` is a handle or null; `server_key` is a NUL-terminated string.
ms_code ms_replica_trust(ms_replica *r, const char *server_key);

// Starts the replica's loop on a thread of its own, connected to `server`
// (`wss://host:port`, or `ws://` to this machine) with the `secret` its
// host issued it, applying only what `server_key` (as `magic-sync key`
// printed it) or a key it endorsed signed. Returns once the loop runs: it
// connects, and connects again, on its own.
//
// # Safety
//
// `r` is a handle or null; the strings are NUL-terminated.
ms_code ms_replica_run(ms_replica *r,
                       const char *server,
                       const char *secret,
                       const char *server_key);

// Tells the running loop the app wrote something: it looks for writes to
// send up now rather than at its next look (a tenth of a second at most).
// Nothing when the loop is not running.
//
// # Safety
//
// `r` is a handle or null.
ms_code ms_replica_nudge(ms_replica *r);

// Has the next [`ms_replica_run`] trust the PEM certificates in the file
// at `pem_path` in place of the system's roots (a fleet's own certificate
// authority, a server's self-signed certificate); null goes back to the
// system's roots. The file is read when the loop connects.
//
// # Safety
//
// `r` is a handle or null; `pem_path` is null or a NUL-terminated string.
ms_code ms_replica_trust_certificates(ms_replica *r, const char *pem_path);

// Stops the replica's loop after the message it applies, and waits for
// it. `MS_OK` when it was not running. When the loop had ended on a
// failure of its own, that failure's code and words.
//
// # Safety
//
// `r` is a handle or null.
ms_code ms_replica_stop(ms_replica *r);

// Stops the replica's loop if it runs, and closes the replica: the handle
// means nothing from then on. The loop's own failure, if it had one, is
// said as [`ms_replica_stop`] says it; the replica is closed anyway.
//
// # Safety
//
// `r` is a handle or null.
ms_code ms_replica_close(ms_replica *r);

// Has `callback` called with `context` and the number of each message
// applied, on the replica's own thread, from the next message on; null
// calls nothing. The callback must not block, and `context` must be
// usable on that thread. It may ask where the replica stands
// ([`ms_replica_status`] and the other questions); it must not call this
// function, and [`ms_replica_stop`] or [`ms_replica_close`] from it are
// refused (`MS_INVALID_ARGUMENT`). Once this returns, the callback it
// replaced is not called again: its context may be freed.
//
// # Safety
//
// `r` is a handle or null; `callback` is null or a function that may be
// called with `context` from another thread until it is replaced or the
// replica is closed.
ms_code ms_replica_on_applied(ms_replica *r, ms_on_applied callback, void *context);

// Where the replica stands, as one JSON object in `json` (free it with
// [`ms_string_free`]): the fields `magic-sync-replica --status --json`
// prints; `stopped`, why the loop last ended on what only the app's
// operator can end; `running`, whether the loop runs; `connected`, whether
// it is connected now; and `link_error`, why it last failed to connect (a
// secret refused, nothing listening, a certificate not trusted) or was
// cut off, `null` while connected.
//
// # Safety
//
// `r` is a handle or null; `json` points at a string pointer the library
// may write.
ms_code ms_replica_status(ms_replica *r, char **json);

// Per table the app writes, rows not sent up yet and rows sent and not
// filed yet, as JSON in `json` (free it with [`ms_string_free`]):
// `{"tables":[{"table":"sales","unsent":2,"unfiled":1}]}`.
//
// # Safety
//
// `r` is a handle or null; `json` points at a string pointer the library
// may write.
ms_code ms_replica_progress(ms_replica *r, char **json);

// The mark of everything the app wrote to the replica's file so far, in
// `mark`: ask [`ms_replica_written`] how far it went.
//
// # Safety
//
// `r` is a handle or null; `mark` points at an `int64_t` the library may
// write.
ms_code ms_replica_mark(ms_replica *r, int64_t *mark);

// How far the app's writes up to `mark` went, in `written`.
//
// # Safety
//
// `r` is a handle or null; `written` points at an `ms_written` the
// library may write.
ms_code ms_replica_written(ms_replica *r, int64_t mark, ms_written *written);

// Waits up to `timeout_ms` until the app's writes up to `mark` went as far
// as `until` (an `ms_written`), and says in `written` how far they went:
// as far as `until`, or less when the time ran out (which is no failure).
//
// # Safety
//
// `r` is a handle or null; `written` points at an `ms_written` the
// library may write.
ms_code ms_replica_wait_written(ms_replica *r,
                                int64_t mark,
                                uint32_t until,
                                uint64_t timeout_ms,
                                ms_written *written);

#ifdef __cplusplus
}  // extern "C"
#endif  // __cplusplus

#endif  /* MAGIC_SYNC_H */
