/* What amqp/_wire.c exports: all that Python sees of it (scripts/build_wire.py hands this file to
 * cffi's cdef, so it holds declarations only; _wire.c includes it, so the compiler holds the two
 * equal). Kept beside the source so that any source tree builds with its own declarations. */
int shoal_bind(void *const *functions, size_t count, int delivery_event);
int shoal_next_event(void *collector, int pop_first, void **out, void **accepted, size_t cap,
                     size_t *taken);
size_t shoal_push(void *transport, const char *data, size_t size);
ssize_t shoal_input(void *transport, char **tail);
void shoal_input_read(void *transport, size_t size);
ssize_t shoal_output(void *transport, const char **head, size_t cap);
void *shoal_send(void *link, uint64_t tag, const char *header, size_t header_size,
                 const char *rest, size_t rest_size, int settle);
void shoal_settle_with(void *delivery, uint64_t state);
int64_t shoal_pending(void *delivery, int64_t max_size);
int shoal_receive(void *link, void *delivery, char *data, size_t size, int64_t *out);
int shoal_scan(const char *data, size_t size, int64_t *out);
int64_t shoal_skip(const char *data, size_t size, size_t pos);
int shoal_outcome(void *delivery);
