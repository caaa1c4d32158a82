/* A till app in C: it opens its replica, runs it until it is ready,
 * prints where it stands, and closes it. The ABI's tests compile and run
 * it against a real server:
 *
 *   till DB ID SERVER SECRET SERVER_KEY
 */
#include "magic_sync.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t changed = PTHREAD_COND_INITIALIZER;
static uint64_t applied = 0;

/* On the replica's thread, after each message applied: no blocking. */
static void on_applied(void *context, uint64_t message) {
  (void)context;
  pthread_mutex_lock(&lock);
  applied = message;
  pthread_cond_signal(&changed);
  pthread_mutex_unlock(&lock);
}

static int fail(const char *what, ms_code code) {
  const char *why = ms_last_error();
  fprintf(stderr, "%s: code %d: %s\n", what, (int)code, why ? why : "(no words)");
  return 1;
}

int main(int argc, char **argv) {
  if (argc != 6) {
    fprintf(stderr, "usage: till DB ID SERVER SECRET SERVER_KEY\n");
    return 2;
  }
  char *json = NULL;
  ms_code code = ms_replica_status(NULL, &json);
  if (code != MS_INVALID_HANDLE) return fail("status of a null handle", code);

  ms_replica *replica = NULL;
  if ((code = ms_replica_open(argv[1], argv[2], &replica)) != MS_OK)
    return fail("open", code);
  if ((code = ms_replica_on_applied(replica, on_applied, NULL)) != MS_OK)
    return fail("on_applied", code);
  if ((code = ms_replica_run(replica, argv[3], argv[4], argv[5])) != MS_OK)
    return fail("run", code);

  /* Wait for each message applied, and ask where the replica stands. */
  struct timespec deadline;
  clock_gettime(CLOCK_REALTIME, &deadline);
  deadline.tv_sec += 60;
  int ready = 0;
  pthread_mutex_lock(&lock);
  while (!ready) {
    pthread_mutex_unlock(&lock);
    if ((code = ms_replica_status(replica, &json)) != MS_OK) return fail("status", code);
    ready = strstr(json, "\"ready\":true") != NULL;
    if (!ready) ms_string_free(json);
    pthread_mutex_lock(&lock);
    if (!ready && pthread_cond_timedwait(&changed, &lock, &deadline) == ETIMEDOUT) {
      pthread_mutex_unlock(&lock);
      fprintf(stderr, "not ready in 60 s\n");
      return 1;
    }
  }
  pthread_mutex_unlock(&lock);
  printf("%s\n", json);
  ms_string_free(json);

  if ((code = ms_replica_stop(replica)) != MS_OK) return fail("stop", code);
  if ((code = ms_replica_close(replica)) != MS_OK) return fail("close", code);
  json = NULL;
  code = ms_replica_status(replica, &json);
  if (code != MS_INVALID_HANDLE || json != NULL) return fail("status of a closed handle", code);
  printf("closed: %s\n", ms_last_error());
  return 0;
}
