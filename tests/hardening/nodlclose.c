/* LD_PRELOAD shim for the sanitizer stage: dlclose does nothing. Open MPI,
 * PMIx and hwloc unload their plugins before exit, and LeakSanitizer then
 * cannot name the module of a leak they made: it shows "<unknown module>",
 * which no suppression can match. Kept loaded, the plugins keep their names
 * and lsan.supp applies. */
int dlclose(void *handle);

int dlclose(void *handle)
{
	(void)handle;
	return 0;
}
