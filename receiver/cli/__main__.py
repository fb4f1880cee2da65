"""``python -m receiver.cli.commands`` is the ``hookledger`` command."""

from receiver.cli.commands import main

if __name__ == "__main__":
    main()
