/*
 * dbwrap_check: runs the conformance checks against one target and prints
 * one JSON line per check. `dbwrap-py check` runs it and draws the table.
 *
 * Usage:
 *   dbwrap_check (--adapter NAME [--option KEY=VALUE]... | --native)
 *                [--single-process] [--no-transactions]
 *                [--lock-release SECONDS] [--max-value BYTES]
 *                [--checker PATH] [--only NAME]... [--keep] [--list]
 *
 * Each check runs in a child process of its own, so a crash or a hang in
 * one is reported as that check's failure and the others still run.
 */

#define _GNU_SOURCE /* nftw */
#include <ftw.h>
#include <getopt.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

struct outcome {
	enum result result;
	char note[sizeof(check_note)];
	char measured[sizeof(check_measured)];
};

struct run_config {
	struct target target;
	const char *only[32];
	int num_only;
	unsigned timeout;
	bool keep;
	bool list;
};

static const struct check *const groups[] = {
	kv_checks, traverse_checks, transaction_checks, database_checks,
	locking_checks, history_checks, persistence_checks, NULL,
};

static void json_string(FILE *f, const char *s)
{
	fputc('"', f);
	for (; *s != '\0'; s++) {
		unsigned char c = *s;

		if (c == '"' || c == '\\') {
			fprintf(f, "\\%c", c);
		} else if (c == '\n') {
			fputs("\\n", f);
		} else if (c < 0x20) {
			fprintf(f, "\\u%04x", c);
		} else {
			fputc(c, f);
		}
	}
	fputc('"', f);
}

static void print_outcome(const struct check *c, const struct outcome *o,
			  long ms)
{
	static const char *const words[] = { "pass", "fail", "skip" };

	printf("{\"check\": ");
	json_string(stdout, c->name);
	printf(", \"rule\": ");
	json_string(stdout, c->rule);
	printf(", \"result\": \"%s\", \"note\": ", words[o->result]);
	json_string(stdout, o->note);
	printf(", \"measured\": ");
	json_string(stdout, o->measured);
	printf(", \"ms\": %ld}\n", ms);
	fflush(stdout);
}

static int remove_entry(const char *path, const struct stat *st, int flag,
			struct FTW *ftw)
{
	return remove(path);
}

/* In the child: run the check, send the outcome up the pipe. */
static void run_in_child(const struct check *c, const struct target *t,
			 const char *dir, int fd)
{
	struct outcome o = { 0 };

	/* a check may write to a pipe whose reader it has just killed */
	signal(SIGPIPE, SIG_IGN);
	check_note[0] = check_measured[0] = '\0';
	o.result = c->fn(t, dir);
	snprintf(o.note, sizeof(o.note), "%s", check_note);
	snprintf(o.measured, sizeof(o.measured), "%s", check_measured);
	if (write(fd, &o, sizeof(o)) != sizeof(o)) {
		_exit(2);
	}
	_exit(0);
}

static void wait_child(pid_t pid, int fd, unsigned timeout, struct outcome *o)
{
	long deadline = now_ms() + timeout * 1000L;
	int wstatus = 0;
	bool exited = false;

	while (!(exited = waitpid(pid, &wstatus, WNOHANG) == pid) &&
	       now_ms() < deadline) {
		sleep_ms(10);
	}
	if (!exited) {
		kill(pid, SIGKILL);
		waitpid(pid, &wstatus, 0);
		o->result = FAIL;
		snprintf(o->note, sizeof(o->note),
			 "no answer within %u s: the check hung", timeout);
		return;
	}
	if (read(fd, o, sizeof(*o)) == sizeof(*o)) {
		return;
	}
	o->result = FAIL;
	if (WIFSIGNALED(wstatus)) {
		snprintf(o->note, sizeof(o->note), "the check process died of signal %d",
			 WTERMSIG(wstatus));
	} else {
		snprintf(o->note, sizeof(o->note), "the check process exited %d "
			 "without a result", WEXITSTATUS(wstatus));
	}
}

static void run_check(const struct check *c, const struct run_config *cfg,
		      const char *root, int index)
{
	struct outcome o = { .result = FAIL };
	char dir[600];
	int fds[2];
	long start = now_ms();
	pid_t pid;

	snprintf(dir, sizeof(dir), "%s/%02d-%s", root, index, c->name);
	if (mkdir(dir, 0700) != 0 || pipe(fds) != 0) {
		snprintf(o.note, sizeof(o.note), "cannot set up %.400s", dir);
		print_outcome(c, &o, 0);
		return;
	}
	fflush(NULL);
	pid = fork();
	if (pid == 0) {
		close(fds[0]);
		run_in_child(c, &cfg->target, dir, fds[1]);
	}
	close(fds[1]);
	if (pid < 0) {
		snprintf(o.note, sizeof(o.note), "fork failed");
	} else {
		wait_child(pid, fds[0], cfg->timeout, &o);
	}
	close(fds[0]);
	print_outcome(c, &o, now_ms() - start);
}

static bool selected(const struct run_config *cfg, const char *name)
{
	int i;

	if (cfg->num_only == 0) {
		return true;
	}
	for (i = 0; i < cfg->num_only; i++) {
		if (strcmp(cfg->only[i], name) == 0) {
			return true;
		}
	}
	return false;
}

static int usage(void)
{
	fprintf(stderr, "usage: dbwrap_check (--adapter NAME [--option K=V]... | "
		"--native) [--single-process] [--no-transactions] "
		"[--lock-release SECONDS] [--max-value BYTES] [--checker PATH] "
		"[--only NAME]... [--timeout SECONDS] [--keep] [--list]\n");
	return 2;
}

static bool parse_args(int argc, char **argv, struct run_config *cfg,
		       const char **options, int max_options)
{
	static const struct option longopts[] = {
		{ "adapter", required_argument, NULL, 'a' },
		{ "option", required_argument, NULL, 'o' },
		{ "native", no_argument, NULL, 'n' },
		{ "single-process", no_argument, NULL, 's' },
		{ "no-transactions", no_argument, NULL, 'T' },
		{ "lock-release", required_argument, NULL, 'l' },
		{ "max-value", required_argument, NULL, 'm' },
		{ "checker", required_argument, NULL, 'c' },
		{ "only", required_argument, NULL, 'O' },
		{ "timeout", required_argument, NULL, 't' },
		{ "keep", no_argument, NULL, 'k' },
		{ "list", no_argument, NULL, 'L' },
		{ NULL, 0, NULL, 0 },
	};
	struct target *t = &cfg->target;
	int opt, num_options = 0;
	bool native = false;

	while ((opt = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
		switch (opt) {
		case 'a': t->adapter = optarg; break;
		case 'o':
			if (num_options == max_options - 1) {
				return false;
			}
			options[num_options++] = optarg;
			break;
		case 'n': native = true; break;
		case 's': t->multi_process = false; break;
		case 'T': t->transactions = false; break;
		case 'l': t->lock_release_seconds = atof(optarg); break;
		case 'm': t->max_value_size = strtoull(optarg, NULL, 10); break;
		case 'c': t->checker = optarg; break;
		case 'O':
			if (cfg->num_only == 32) {
				return false;
			}
			cfg->only[cfg->num_only++] = optarg;
			break;
		case 't': cfg->timeout = atoi(optarg); break;
		case 'k': cfg->keep = true; break;
		case 'L': cfg->list = true; break;
		default: return false;
		}
	}
	options[num_options] = NULL;
	t->options = options;
	return cfg->list || native != (t->adapter != NULL);
}

int main(int argc, char **argv)
{
	const char *options[64];
	struct run_config cfg = {
		.target = { .multi_process = true, .transactions = true },
		.timeout = 120,
	};
	const char *tmp = getenv("TMPDIR");
	char root[512];
	int g, i, index = 0;

	if (!parse_args(argc, argv, &cfg, options, 64) || optind != argc) {
		return usage();
	}
	snprintf(root, sizeof(root), "%s/dbwrap_check.XXXXXX", tmp ? tmp : "/tmp");
	if (!cfg.list && mkdtemp(root) == NULL) {
		perror("mkdtemp");
		return 1;
	}
	for (g = 0; groups[g] != NULL; g++) {
		for (i = 0; groups[g][i].name != NULL; i++) {
			const struct check *c = &groups[g][i];

			if (cfg.list) {
				printf("{\"check\": \"%s\", \"rule\": ", c->name);
				json_string(stdout, c->rule);
				printf("}\n");
			} else if (selected(&cfg, c->name)) {
				run_check(c, &cfg, root, index++);
			}
		}
	}
	if (!cfg.list && !cfg.keep) {
		nftw(root, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
	} else if (cfg.keep) {
		fprintf(stderr, "dbwrap_check: kept %s\n", root);
	}
	return 0;
}
