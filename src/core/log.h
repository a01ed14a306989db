/* core/log: leveled log lines to stderr (journald reads stderr).
 * One write(2) per line so lines from several threads never interleave.
 * The level is set once at start-up. */
#ifndef SD_CORE_LOG_H
#define SD_CORE_LOG_H

enum { SD_LOG_ERROR = 0, SD_LOG_WARN = 1, SD_LOG_INFO = 2, SD_LOG_DEBUG = 3 };

void sd_log_set_level(int level);
int sd_log_level(void);
/* "error" | "warn" | "info" | "debug" -> level, or -1 */
int sd_log_parse_level(const char *s);
void sd_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define sd_log_error(...) sd_log(SD_LOG_ERROR, __VA_ARGS__)
#define sd_log_warn(...) sd_log(SD_LOG_WARN, __VA_ARGS__)
#define sd_log_info(...) sd_log(SD_LOG_INFO, __VA_ARGS__)
#define sd_log_debug(...) sd_log(SD_LOG_DEBUG, __VA_ARGS__)

#endif
