/*
 * One log line per failure, naming the database, the operation and the cause.
 *
 * Inside smbd the line goes through Samba's own debug system (found at run
 * time, so it lands in smbd's log file); elsewhere it goes to stderr.
 */

#ifndef DBWRAP_PY_LOG_H
#define DBWRAP_PY_LOG_H

/* Samba debug levels: errors at 0, opens at 3, routine answers (a missing key) at 10 */
#define DBWRAP_PY_LOG_ERROR 0
#define DBWRAP_PY_LOG_INFO 3
#define DBWRAP_PY_LOG_ROUTINE 10

void dbwrap_py_log_level(int level, const char *dbname, const char *op,
			 const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

#define dbwrap_py_log(dbname, op, ...) \
	dbwrap_py_log_level(DBWRAP_PY_LOG_ERROR, dbname, op, __VA_ARGS__)

#endif /* DBWRAP_PY_LOG_H */
