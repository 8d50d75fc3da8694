"""The MariaDB table of every type the capture tests load (tests/capture) and other engines read (tests/query): its
DDL, its columns and one row of values (``%s``: the id). A module of its own so that test modules in any folder import
it the same way.
"""

TYPES_DDL = """CREATE TABLE types (
 id INT PRIMARY KEY,
 b1 TINYINT(1), bo BOOLEAN, ti TINYINT, tiu TINYINT UNSIGNED, si SMALLINT, siu SMALLINT UNSIGNED,
 mi MEDIUMINT, miu MEDIUMINT UNSIGNED, i INT, iu INT UNSIGNED, bi BIGINT, biu BIGINT UNSIGNED,
 de DECIMAL(12,3), de65 DECIMAL(65,10), f FLOAT, d DOUBLE,
 dt DATE, dtm0 DATETIME, dtm3 DATETIME(3), dtm6 DATETIME(6), ts TIMESTAMP NULL, ts6 TIMESTAMP(6) NULL,
 tm TIME, tm6 TIME(6), y YEAR,
 c CHAR(5), vc VARCHAR(50), tx TEXT, bn BINARY(4), vb VARBINARY(10), bl BLOB,
 bit1 BIT(1), bit5 BIT(5), bit16 BIT(16), bit64 BIT(64),
 en ENUM('a','b','c'), st SET('x','y','z'), js JSON, g GEOMETRY, pt POINT,
 gen BIGINT AS (i * 2) VIRTUAL, gens VARCHAR(60) AS (CONCAT(vc, '!')) STORED
)"""
TYPES_COLUMNS = (
    "id,b1,bo,ti,tiu,si,siu,mi,miu,i,iu,bi,biu,de,de65,f,d,dt,dtm0,dtm3,dtm6,ts,ts6,tm,tm6,y,c,vc,tx,bn,vb,"
    "bl,bit1,bit5,bit16,bit64,en,st,js,g,pt"
)
TYPES_VALUES = """(%s, 1, 0, -128, 255, -32768, 65535, -8388608, 16777215, -2147483648, 4294967295,
 -9223372036854775808, 18446744073709551615, 123456789.123,
 12345678901234567890123456789012345678901234567890.0123456789, 1.5, 2.25,
 '2024-02-29', '2024-02-29 13:14:15', '2024-02-29 13:14:15.123', '2024-02-29 13:14:15.123456',
 '2024-02-29 13:14:15', '2024-02-29 13:14:15.654321', '-838:59:59', '12:34:56.789012', 2024,
 'ab', 'héllo 🚀', 'long text ✓', x'00010203', x'ff00', x'deadbeef',
 b'1', b'10101', b'0000000100000010', b'1111111111111111111111111111111111111111111111111111111111111111',
 'b', 'x,z', '{"a": [1, 2, {"b": null}]}', ST_GeomFromText('POLYGON((0 0,1 0,1 1,0 0))'),
 ST_GeomFromText('POINT(1 2)'))"""
