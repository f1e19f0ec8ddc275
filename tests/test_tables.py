"""Tables in a chunk's text (``django_ragchat.tables``)."""

from django_ragchat.tables import table_cells, table_words


def test_a_row_is_read_as_written_or_as_the_loader_stores_it():
    assert table_cells("| Band | Annual charge |") == ["Band", "Annual charge"]
    assert table_cells("D | £2,103") == ["D", "£2,103"]
    assert table_cells("no row") == []


def test_a_table_reads_as_its_columns_and_its_rows_words():
    text = ("Bins > Which bin\n| Bin | Colour | Collected |\n| --- | --- | --- |\n"
            "| Dry recycling | Blue | Every other Tuesday |\n| Band | D | £2,103 |\n| up to | £40,000 | £1,402 |")
    assert table_words(text) == ("Bins > Which bin\nBin, Colour, Collected.\nDry recycling Blue Every other Tuesday.\n"
                                 "Band.")


def test_text_without_a_table_is_returned_as_is():
    prose = "Contact the team on 01632 960 300. A | alone is no table."
    assert table_words("Band D costs £2,103 a year.") == "Band D costs £2,103 a year."
    assert table_words(prose) == prose
