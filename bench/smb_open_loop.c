/*
 * smb_open_loop: opens/s of N SMB clients, counted in bins of any width.
 *
 *   smb_open_loop --user USER[%PASSWORD] --time SECONDS [--bin-ms 500]
 *                 [--clients N] --path FILE [--connect-timeout 60] [--grace 30]
 *                 smb://HOST:PORT/SHARE [smb://HOST2:PORT/SHARE ...]
 *
 * make bench-elastic's client (python/dbwrap_py/bench/open_loop.py):
 * smbtorture's path-contention-shared prints one sample per second, this
 * counts into bins of --bin-ms.
 *
 * It forks N clients, spread round-robin over the share URLs. Each makes
 * its own libsmbclient context (SMB2_02 or later), opens and closes FILE
 * once to connect (not counted), and waits until all N are connected.
 * The parent then starts the common clock and prints RUNNING; every client
 * opens (O_RDONLY) and closes FILE until SECONDS after that start, adding
 * each completed open+close to the bin it ended in (shared memory, atomic
 * adds). Failed opens or closes are counted, the first one's text kept per
 * client; after a failure a client waits ERROR_PAUSE_MS before the next
 * try, so a refused connection does not spin a core.
 *
 * stdout: "RUNNING" (flushed at once), then one "bin START_SECONDS OPENS"
 * line per bin (START_SECONDS since the common start), "errors N" and an
 * "error CLIENT TEXT" line per client that had one. Exit status 0 when
 * every client connected and ran to the end; otherwise non-zero, the cause
 * on stderr. Without %PASSWORD the password comes from $PASSWD (as Samba's
 * own tools take it), which keeps it off the command line.
 *
 * Every wait is bounded: clients that are not all connected within
 * --connect-timeout fail the run; clients still running --grace seconds
 * after the end are killed by PID and named. The clients die with the
 * parent (PR_SET_PDEATHSIG).
 */

#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <libsmbclient.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_CLIENTS 4096
#define MAX_BINS 1000000
#define MAX_SECONDS 86400
#define ERROR_TEXT 400
#define FAILURE_TEXT 160
/* libsmbclient's debug level while a client connects: level 3 has its
 * "SPNEGO login failed: <why>"; and in the loop, where only failures log */
#define CONNECT_DEBUG 3
#define LOOP_DEBUG 1
#define ERROR_PAUSE_MS 10
#define PARENT_POLL_MS 10
#define NS_PER_MS 1000000LL
#define NS_PER_S 1000000000LL

/* exit statuses */
#define EXIT_USAGE 2
#define EXIT_FAILED 1
#define CLIENT_CONNECT_FAILED 3
#define CLIENT_NO_START 4
/* a client's PID once the parent killed and reaped it (0: it exited itself) */
#define KILLED ((pid_t)-1)

struct options {
	char user[256];
	char password[256];
	long long run_ms;
	long long bin_ms;
	int clients;
	const char *path;
	int connect_timeout_s;
	int grace_s;
	char **urls;
	int nurls;
};

/* one client's slot; only that client writes it */
struct client_slot {
	int connected;     /* its connecting open+close succeeded */
	int measured;      /* its loop reached the end */
	uint64_t errors;   /* failed opens and closes in the loop */
	char error[ERROR_TEXT]; /* the first failure, connecting or in the loop */
};

struct shared {
	int64_t start_ns;  /* the common start (CLOCK_MONOTONIC), set before the go */
	int connected;     /* clients connected */
	int failed;        /* clients that could not connect */
	struct client_slot *slots;
	uint64_t *bins;
	long long nbins;
};

/* this process's last libsmbclient message that says something failed */
static char last_failure[FAILURE_TEXT];

static int64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * NS_PER_S + ts.tv_nsec;
}

static void sleep_ms(long ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * NS_PER_MS };

	while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
	}
}

static void usage(const char *why)
{
	fprintf(stderr, "smb_open_loop: %s\n"
		"usage: smb_open_loop --user USER[%%PASSWORD] --time SECONDS [--bin-ms MS] "
		"[--clients N] --path FILE [--connect-timeout SECONDS] [--grace SECONDS] "
		"smb://HOST[:PORT]/SHARE ...\n", why);
	exit(EXIT_USAGE);
}

/* a whole number in [min, max], or usage() naming the option */
static long long number(const char *option, const char *text, long long min, long long max)
{
	char *end = NULL;
	long long value;
	char why[200];

	errno = 0;
	value = strtoll(text, &end, 10);
	if (errno != 0 || end == text || *end != '\0' || value < min || value > max) {
		snprintf(why, sizeof(why), "--%s %s: a whole number from %lld to %lld", option, text,
			 min, max);
		usage(why);
	}
	return value;
}

/* --time in seconds, decimals allowed, as milliseconds */
static long long run_milliseconds(const char *text)
{
	char *end = NULL;
	double seconds;
	char why[200];

	errno = 0;
	seconds = strtod(text, &end);
	if (errno != 0 || end == text || *end != '\0' || !(seconds > 0) || seconds > MAX_SECONDS) {
		snprintf(why, sizeof(why), "--time %s: seconds, more than 0 and at most %d", text,
			 MAX_SECONDS);
		usage(why);
	}
	return (long long)(seconds * 1000 + 0.5);
}

static void copy_text(char *to, size_t size, const char *from, const char *what)
{
	char why[100];

	if (strlen(from) >= size) {
		snprintf(why, sizeof(why), "the %s is longer than %zu characters", what, size - 1);
		usage(why);
	}
	memcpy(to, from, strlen(from) + 1);
}

/* USER%PASSWORD, or USER and $PASSWD */
static void split_user(struct options *o, const char *text)
{
	const char *percent = strchr(text, '%');
	const char *password = percent ? percent + 1 : getenv("PASSWD");
	char user[sizeof(o->user)];
	size_t length = percent ? (size_t)(percent - text) : strlen(text);

	if (length == 0 || length >= sizeof(user))
		usage("--user: give USER%PASSWORD (or USER, and the password in $PASSWD)");
	if (password == NULL)
		usage("--user names no password after %, and $PASSWD is not set");
	memcpy(user, text, length);
	user[length] = '\0';
	copy_text(o->user, sizeof(o->user), user, "user name");
	copy_text(o->password, sizeof(o->password), password, "password");
}

static void check_options(struct options *o)
{
	char why[200];

	if (o->user[0] == '\0')
		usage("--user is required");
	if (o->run_ms == 0)
		usage("--time is required");
	if (o->path == NULL || o->path[0] == '\0')
		usage("--path is required");
	if (o->nurls == 0)
		usage("no share URL given");
	for (int i = 0; i < o->nurls; i++) {
		if (strncmp(o->urls[i], "smb://", 6) != 0) {
			snprintf(why, sizeof(why), "%s is not a share URL (smb://HOST[:PORT]/SHARE)",
				 o->urls[i]);
			usage(why);
		}
	}
	if (o->run_ms % o->bin_ms != 0) {
		snprintf(why, sizeof(why), "--time of %lld ms is not a whole number of --bin-ms %lld bins",
			 o->run_ms, o->bin_ms);
		usage(why);
	}
	if (o->run_ms / o->bin_ms > MAX_BINS)
		usage("more than 1000000 bins: a longer --bin-ms or a shorter --time");
}

static void parse_options(struct options *o, int argc, char **argv)
{
	static const struct option longs[] = {
		{ "user", required_argument, NULL, 'u' },
		{ "time", required_argument, NULL, 't' },
		{ "bin-ms", required_argument, NULL, 'b' },
		{ "clients", required_argument, NULL, 'n' },
		{ "path", required_argument, NULL, 'p' },
		{ "connect-timeout", required_argument, NULL, 'c' },
		{ "grace", required_argument, NULL, 'g' },
		{ NULL, 0, NULL, 0 },
	};
	int c;

	*o = (struct options){ .bin_ms = 500, .clients = 1, .connect_timeout_s = 60, .grace_s = 30 };
	while ((c = getopt_long(argc, argv, "", longs, NULL)) != -1) {
		switch (c) {
		case 'u': split_user(o, optarg); break;
		case 't': o->run_ms = run_milliseconds(optarg); break;
		case 'b': o->bin_ms = number("bin-ms", optarg, 1, 3600000); break;
		case 'n': o->clients = (int)number("clients", optarg, 1, MAX_CLIENTS); break;
		case 'p': o->path = optarg; break;
		case 'c': o->connect_timeout_s = (int)number("connect-timeout", optarg, 1, 3600); break;
		case 'g': o->grace_s = (int)number("grace", optarg, 1, 3600); break;
		default: usage("unknown option");
		}
	}
	o->urls = argv + optind;
	o->nurls = argc - optind;
	check_options(o);
}

/* ---- shared memory ------------------------------------------------------- */

static void *shared_zeroed(size_t size, const char *what)
{
	void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED) {
		fprintf(stderr, "smb_open_loop: mmap of %zu bytes for the %s: %s\n", size, what,
			strerror(errno));
		exit(EXIT_FAILED);
	}
	return p;
}

static struct shared *shared_state(const struct options *o)
{
	struct shared *s = shared_zeroed(sizeof(*s), "shared state");

	s->nbins = o->run_ms / o->bin_ms;
	s->slots = shared_zeroed(sizeof(*s->slots) * (size_t)o->clients, "client slots");
	s->bins = shared_zeroed(sizeof(*s->bins) * (size_t)s->nbins, "bins");
	return s;
}

/* ---- one client ---------------------------------------------------------- */

/* keeps libsmbclient's last message that names a failure (one line, trimmed) */
static void log_line(void *private_ptr, int level, const char *msg)
{
	static const char *const words[] = { "fail", "NT_STATUS_", "error", "denied", "refused",
					     "invalid", "timed out", "timeout" };
	size_t n = strcspn(msg, "\r\n");
	bool failure = false;

	(void)private_ptr;
	(void)level;
	for (size_t i = 0; i < sizeof(words) / sizeof(words[0]) && !failure; i++)
		failure = strcasestr(msg, words[i]) != NULL;
	if (!failure)
		return;
	if (n >= sizeof(last_failure))
		n = sizeof(last_failure) - 1;
	memcpy(last_failure, msg, n);
	last_failure[n] = '\0';
}

static void give_credentials(SMBCCTX *ctx, const char *srv, const char *shr, char *wg, int wglen,
			     char *un, int unlen, char *pw, int pwlen)
{
	const struct options *o = smbc_getOptionUserData(ctx);

	(void)srv;
	(void)shr;
	(void)wg;
	(void)wglen;
	snprintf(un, (size_t)unlen, "%s", o->user);
	snprintf(pw, (size_t)pwlen, "%s", o->password);
}

/* the first failure of this client: what failed, errno's text, and
 * libsmbclient's own message about it, if it logged one */
static void note_error(struct client_slot *slot, const char *what, int err)
{
	if (slot->error[0] != '\0')
		return;
	snprintf(slot->error, sizeof(slot->error), "%.100s: %.80s (errno %d)%s%.159s", what,
		 strerror(err), err, last_failure[0] ? "; libsmbclient: " : "", last_failure);
}

static SMBCCTX *new_context(struct options *o, struct client_slot *slot)
{
	SMBCCTX *ctx = smbc_new_context();

	if (ctx == NULL) {
		note_error(slot, "smbc_new_context", errno);
		return NULL;
	}
	smbc_setOptionUserData(ctx, o);
	smbc_setFunctionAuthDataWithContext(ctx, give_credentials);
	smbc_setOptionNoAutoAnonymousLogin(ctx, true);
	smbc_setOptionUseKerberos(ctx, false);
	smbc_setDebug(ctx, CONNECT_DEBUG);
	smbc_setLogCallback(ctx, NULL, log_line);
	if (!smbc_setOptionProtocols(ctx, "SMB2_02", NULL)) {
		note_error(slot, "client min protocol SMB2_02 refused", EINVAL);
		smbc_free_context(ctx, 0);
		return NULL;
	}
	if (smbc_init_context(ctx) == NULL) {
		note_error(slot, "smbc_init_context", errno);
		smbc_free_context(ctx, 0);
		return NULL;
	}
	return ctx;
}

/* one open (O_RDONLY) and close of url; errno set when false */
static bool open_close(SMBCCTX *ctx, const char *url, const char **failed)
{
	SMBCFILE *file;

	last_failure[0] = '\0';
	file = smbc_getFunctionOpen(ctx)(ctx, url, O_RDONLY, 0);

	if (file == NULL) {
		*failed = "open";
		return false;
	}
	if (smbc_getFunctionClose(ctx)(ctx, file) != 0) {
		*failed = "close";
		return false;
	}
	return true;
}

/* until the parent's go (its end of the pipe closed), at most timeout_ms */
static bool wait_for_go(int go_fd, int timeout_ms)
{
	struct pollfd p = { .fd = go_fd, .events = POLLIN };
	int64_t deadline = now_ns() + (int64_t)timeout_ms * NS_PER_MS;
	char byte;

	while (now_ns() < deadline) {
		int left = (int)((deadline - now_ns()) / NS_PER_MS) + 1;
		int ready = poll(&p, 1, left);

		if (ready > 0)
			return read(go_fd, &byte, 1) == 0;
		if (ready < 0 && errno != EINTR)
			return false;
	}
	return false;
}

static void measure(struct shared *s, const struct options *o, SMBCCTX *ctx, const char *url,
		    struct client_slot *slot)
{
	int64_t start = __atomic_load_n(&s->start_ns, __ATOMIC_ACQUIRE);
	int64_t end = start + o->run_ms * NS_PER_MS;
	int64_t bin_ns = o->bin_ms * NS_PER_MS;
	int64_t now = now_ns();
	const char *failed = NULL;

	while (now < end) {
		bool ok = open_close(ctx, url, &failed);
		int err = errno;

		now = now_ns();
		if (ok && now < end) {
			__atomic_fetch_add(&s->bins[(now - start) / bin_ns], 1, __ATOMIC_RELAXED);
		} else if (!ok) {
			__atomic_fetch_add(&slot->errors, 1, __ATOMIC_RELAXED);
			note_error(slot, failed, err);
			sleep_ms(ERROR_PAUSE_MS);
			now = now_ns();
		}
	}
	__atomic_store_n(&slot->measured, 1, __ATOMIC_RELEASE);
}

/* what an errno from the share itself (before any file) most likely means */
static const char *share_failure(int err)
{
	switch (err) {
	case ENOENT: return "connecting to the share (no share of that name)";
	case EACCES:
	case EPERM: return "connecting to the share (logon failure or access denied)";
	case ECONNREFUSED: return "connecting to the share (nothing listens there)";
	case ETIMEDOUT: return "connecting to the share (no answer)";
	default: return "connecting to the share";
	}
}

/* the share (its folder opened), then FILE opened and closed once; false with the cause noted */
static bool connect_client(SMBCCTX *ctx, const char *share, const char *url, const char *path,
			   struct client_slot *slot)
{
	const char *failed = NULL;
	char what[100];
	SMBCFILE *dir;
	int err;

	last_failure[0] = '\0';
	dir = smbc_getFunctionOpendir(ctx)(ctx, share);
	if (dir == NULL) {
		err = errno;
		note_error(slot, share_failure(err), err);
		return false;
	}
	smbc_getFunctionClosedir(ctx)(ctx, dir);
	if (!open_close(ctx, url, &failed)) {
		err = errno;
		snprintf(what, sizeof(what), "the first %s of %.60s", failed, path);
		note_error(slot, what, err);
		return false;
	}
	return true;
}

static int run_client(struct shared *s, struct options *o, int index, int go_fd)
{
	struct client_slot *slot = &s->slots[index];
	char share[1024], url[2048];
	const char *given = o->urls[index % o->nurls];
	size_t n = strlen(given);
	SMBCCTX *ctx;

	prctl(PR_SET_PDEATHSIG, SIGKILL);
	snprintf(share, sizeof(share), "%.*s", (int)(n && given[n - 1] == '/' ? n - 1 : n), given);
	snprintf(url, sizeof(url), "%s/%s", share, o->path[0] == '/' ? o->path + 1 : o->path);
	ctx = new_context(o, slot);
	if (ctx == NULL || !connect_client(ctx, share, url, o->path, slot)) {
		__atomic_fetch_add(&s->failed, 1, __ATOMIC_RELEASE);
		return CLIENT_CONNECT_FAILED;
	}
	smbc_setDebug(ctx, LOOP_DEBUG);
	__atomic_store_n(&slot->connected, 1, __ATOMIC_RELEASE);
	__atomic_fetch_add(&s->connected, 1, __ATOMIC_RELEASE);
	if (!wait_for_go(go_fd, (o->connect_timeout_s + 5) * 1000)) {
		note_error(slot, "no start from the parent", ETIMEDOUT);
		return CLIENT_NO_START;
	}
	measure(s, o, ctx, url, slot);
	smbc_free_context(ctx, 1);
	return 0;
}

/* ---- the parent ---------------------------------------------------------- */

/* SIGKILL to every client still running, by its PID; each is marked KILLED */
static void kill_all(pid_t *pids, int n)
{
	for (int i = 0; i < n; i++) {
		if (pids[i] > 0)
			kill(pids[i], SIGKILL);
	}
	for (int i = 0; i < n; i++) {
		if (pids[i] > 0 && waitpid(pids[i], NULL, 0) == pids[i])
			pids[i] = KILLED;
	}
}

/* reaps the clients that exited; the number that exited non-zero */
static int reap(pid_t *pids, int n, int *statuses)
{
	int bad = 0;

	for (int i = 0; i < n; i++) {
		int status;

		if (pids[i] > 0 && waitpid(pids[i], &status, WNOHANG) == pids[i]) {
			pids[i] = 0;
			statuses[i] = status;
		}
		if (pids[i] == 0 && !(WIFEXITED(statuses[i]) && WEXITSTATUS(statuses[i]) == 0))
			bad++;
	}
	return bad;
}

static int running(const pid_t *pids, int n)
{
	int count = 0;

	for (int i = 0; i < n; i++)
		count += pids[i] > 0;
	return count;
}

static void describe_exit(int client, int status, const char *url)
{
	if (WIFSIGNALED(status))
		fprintf(stderr, "smb_open_loop: client %d (%s) died of signal %d (%s)\n", client, url,
			WTERMSIG(status), strsignal(WTERMSIG(status)));
	else if (WIFEXITED(status) && WEXITSTATUS(status) != 0)
		fprintf(stderr, "smb_open_loop: client %d (%s) exited with %d\n", client, url,
			WEXITSTATUS(status));
}

/* until every client is connected; false (the cause on stderr) otherwise */
static bool wait_connected(struct shared *s, const struct options *o, pid_t *pids, int *statuses)
{
	int64_t deadline = now_ns() + (int64_t)o->connect_timeout_s * NS_PER_S;

	while (__atomic_load_n(&s->connected, __ATOMIC_ACQUIRE) < o->clients) {
		if (reap(pids, o->clients, statuses) > 0 || __atomic_load_n(&s->failed, __ATOMIC_ACQUIRE))
			return false;
		if (now_ns() >= deadline) {
			fprintf(stderr, "smb_open_loop: only %d of %d clients connected within "
				"--connect-timeout %d s\n", __atomic_load_n(&s->connected, __ATOMIC_ACQUIRE),
				o->clients, o->connect_timeout_s);
			return false;
		}
		sleep_ms(PARENT_POLL_MS);
	}
	return true;
}

/* until every client exits, at most until the end and the grace; false if one hung */
static bool wait_finished(struct shared *s, const struct options *o, pid_t *pids, int *statuses)
{
	int64_t deadline = s->start_ns + (o->run_ms + (int64_t)o->grace_s * 1000) * NS_PER_MS;

	reap(pids, o->clients, statuses);
	while (running(pids, o->clients) > 0 && now_ns() < deadline) {
		sleep_ms(PARENT_POLL_MS);
		reap(pids, o->clients, statuses);
	}
	if (running(pids, o->clients) == 0)
		return true;
	for (int i = 0; i < o->clients; i++) {
		if (pids[i] > 0)
			fprintf(stderr, "smb_open_loop: client %d (pid %d, %s) hung: still running %d s "
				"after the end%s; killed\n", i, (int)pids[i], o->urls[i % o->nurls],
				o->grace_s, s->slots[i].measured ? " (its loop had ended, disconnecting)" :
				" (in its loop)");
	}
	kill_all(pids, o->clients);
	return false;
}

/* the bins (if the run started), then the errors */
static void print_results(const struct shared *s, const struct options *o, bool started)
{
	uint64_t errors = 0;

	for (long long b = 0; started && b < s->nbins; b++)
		printf("bin %.3f %llu\n", (double)(b * o->bin_ms) / 1000.0,
		       (unsigned long long)s->bins[b]);
	for (int i = 0; i < o->clients; i++)
		errors += s->slots[i].errors + (s->slots[i].connected ? 0 : 1);
	printf("errors %llu\n", (unsigned long long)errors);
	for (int i = 0; i < o->clients; i++) {
		if (s->slots[i].error[0] != '\0')
			printf("error %d %s: %s\n", i, o->urls[i % o->nurls], s->slots[i].error);
	}
	fflush(stdout);
}

/* the clients' causes on stderr, for a run that failed before it started */
static void report_connect_failure(const struct shared *s, const struct options *o,
				   const int *statuses, const pid_t *pids)
{
	for (int i = 0; i < o->clients; i++) {
		const char *url = o->urls[i % o->nurls];

		if (!s->slots[i].connected && s->slots[i].error[0] != '\0')
			fprintf(stderr, "smb_open_loop: client %d could not connect to %s: %s\n", i, url,
				s->slots[i].error);
		else if (pids[i] == 0)
			describe_exit(i, statuses[i], url);
		else if (!s->slots[i].connected && pids[i] == KILLED)
			fprintf(stderr, "smb_open_loop: client %d (%s) had not connected yet; killed\n", i,
				url);
	}
}

static bool fork_clients(struct shared *s, struct options *o, pid_t *pids, int go[2])
{
	for (int i = 0; i < o->clients; i++) {
		pids[i] = fork();
		if (pids[i] < 0) {
			fprintf(stderr, "smb_open_loop: fork of client %d: %s\n", i, strerror(errno));
			pids[i] = 0;
			return false;
		}
		if (pids[i] == 0) {
			close(go[1]);
			_exit(run_client(s, o, i, go[0]));
		}
	}
	return true;
}

static int finish(struct shared *s, struct options *o, pid_t *pids, int *statuses)
{
	bool all_ran = wait_finished(s, o, pids, statuses);
	int bad = 0;

	for (int i = 0; i < o->clients; i++) {
		if (pids[i] == 0 && !(WIFEXITED(statuses[i]) && WEXITSTATUS(statuses[i]) == 0)) {
			describe_exit(i, statuses[i], o->urls[i % o->nurls]);
			bad++;
		}
	}
	print_results(s, o, true);
	return all_ran && bad == 0 ? 0 : EXIT_FAILED;
}

int main(int argc, char **argv)
{
	struct options o;
	struct shared *s;
	pid_t *pids;
	int *statuses;
	int go[2];

	parse_options(&o, argc, argv);
	s = shared_state(&o);
	pids = calloc((size_t)o.clients, sizeof(*pids));
	statuses = calloc((size_t)o.clients, sizeof(*statuses));
	if (pids == NULL || statuses == NULL || pipe(go) != 0) {
		fprintf(stderr, "smb_open_loop: out of memory or pipes: %s\n", strerror(errno));
		return EXIT_FAILED;
	}
	fflush(stdout);
	if (!fork_clients(s, &o, pids, go) || !wait_connected(s, &o, pids, statuses)) {
		kill_all(pids, o.clients);
		report_connect_failure(s, &o, statuses, pids);
		print_results(s, &o, false);
		fprintf(stderr, "smb_open_loop: not every client connected: the run did not start\n");
		return EXIT_FAILED;
	}
	__atomic_store_n(&s->start_ns, now_ns(), __ATOMIC_RELEASE);
	close(go[1]);
	printf("RUNNING\n");
	fflush(stdout);
	return finish(s, &o, pids, statuses);
}
