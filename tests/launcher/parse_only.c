/*
 * The launcher's parse of a command line, printed (tests/test_launcher_parse.py compares it with
 * runc_guard/invocation.py's). The product file is included whole, its main renamed: the test
 * build parses with the very functions the launcher routes with, and routes nothing.
 */
#define main launcher_main
#include "../../launcher/runc-guard.c"
#undef main

static void put_hex(const char *label, const char *s)
{
	printf("%s=", label);
	if (s == NULL)
		printf("-");
	else
		for (printf("x"); *s; s++)
			printf("%02x", (unsigned char)*s);
	printf("\n");
}

int main(int argc, char **argv)
{
	struct invocation inv;

	if (argc < 1)
		bail(EXIT_CONFIG, "started without argv[0]");
	parse(argv + 1, &inv);
	put_hex("subcommand", inv.subcommand);
	put_hex("id", inv.container_id);
	printf("force=%d\n", inv.force);
	put_hex("root", state_root(&inv));
	printf("delete=%d\n", inv.is_delete);
	return 0;
}
