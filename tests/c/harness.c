/*
 * Test harness: opening databases per backend, child processes with a time
 * limit, and the result table.
 */

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

char result_note[256];

struct db_context *open_db(TALLOC_CTX *mem_ctx, const struct backend *b,
			   const char *dir, const char *file, int tdb_flags,
			   enum dbwrap_lock_order order)
{
	return reopen_db(mem_ctx, b, dir, file, tdb_flags, order, 0);
}

struct db_context *reopen_db(TALLOC_CTX *mem_ctx, const struct backend *b,
			     const char *dir, const char *file, int tdb_flags,
			     enum dbwrap_lock_order order, uint64_t dbwrap_flags)
{
	char *path = talloc_asprintf(mem_ctx, "%s/%s", dir, file);
	struct db_context *db;

	if (b->adapter == NULL) {
		db = db_open_tdb(mem_ctx, path, 0, tdb_flags, O_RDWR | O_CREAT,
				 0600, order, dbwrap_flags);
	} else {
		db = db_open_py(mem_ctx, path, 0, tdb_flags, O_RDWR | O_CREAT,
				0600, order, dbwrap_flags, b->adapter, b->options);
	}
	if (db == NULL) {
		fprintf(stderr, "    open %s on %s failed: %s\n", path, b->name,
			strerror(errno));
	}
	return db;
}

int run_children(int (*fn)(void *arg), void *arg, int n, unsigned seconds)
{
	struct timespec tick = { 0, 10 * 1000 * 1000 };
	unsigned waited_ms = 0;
	pid_t pids[64];
	int i, failed = 0, running = 0, wstatus;

	if (n > 64) {
		return n;
	}
	fflush(NULL);
	for (i = 0; i < n; i++) {
		pids[i] = fork();
		if (pids[i] == 0) {
			alarm(seconds + 5); /* a hung child must not outlive the test */
			_exit(fn(arg));
		}
		if (pids[i] < 0) {
			failed++;
		} else {
			running++;
		}
	}
	while (running > 0) {
		for (i = 0; i < n; i++) {
			if (pids[i] <= 0 || waitpid(pids[i], &wstatus, WNOHANG) == 0) {
				continue;
			}
			if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0) {
				fprintf(stderr, "    child %d failed: status 0x%x\n",
					(int)pids[i], wstatus);
				failed++;
			}
			pids[i] = 0;
			running--;
		}
		if (running > 0 && waited_ms >= seconds * 1000) {
			for (i = 0; i < n; i++) {
				if (pids[i] > 0) {
					kill(pids[i], SIGKILL);
					waitpid(pids[i], &wstatus, 0);
					failed++;
				}
			}
			fprintf(stderr, "    children took over %us\n", seconds);
			break;
		}
		nanosleep(&tick, NULL);
		waited_ms += 10;
	}
	return failed;
}
